"""Container HEALTHCHECK: exit 0 when the service's /healthz answers 200."""

import os
import sys
import urllib.request

port = os.environ.get("RLFLEET_METRICS__PORT", "9100")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception as exc:  # 503 (unhealthy), refused, timeout
    print(f"unhealthy: {exc}", file=sys.stderr)
    sys.exit(1)
