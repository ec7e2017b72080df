"""The experiment file: one YAML read by every service.

Precedence, lowest first: the file, environment variables, ``--set`` flags.

- Environment: ``RLFLEET_<SECTION>__<FIELD>=value`` (``__`` between levels,
  list items by index), e.g. ``RLFLEET_REPLAY__DURABILITY=wal`` or
  ``RLFLEET_REPLAY__TABLES__0__CAPACITY=50000``. Values are parsed as YAML,
  so ``RLFLEET_NETWORK__REPLAY='[tcp://replay:5550]'`` is a list.
- CLI: ``--set replay.durability=wal`` (dots between levels).

Validation happens at start-up; every problem is reported with the field, the
bad value and what is allowed (:class:`ConfigError`).

The modules: :mod:`.sections` holds the pydantic section of each service,
:mod:`.algorithm` the algorithm's section (gathered from the algorithm folders), :mod:`.experiment` the whole file
and its cross-section checks, :mod:`.loading` reading, overrides and error
messages. Import from ``rlfleet.common.config``.
"""

from rlfleet.common.config.algorithm import AlgorithmConfig
from rlfleet.common.config.experiment import Experiment, bind_address
from rlfleet.common.config.loading import (
    ENV_PREFIX,
    ConfigError,
    cli_overrides,
    dump,
    env_overrides,
    format_errors,
    load,
    validate,
)
from rlfleet.common.config.sections import (
    ActorConfig,
    AtariConfig,
    EnvConfig,
    EvaluatorConfig,
    LearnerConfig,
    LoggingConfig,
    MetricsConfig,
    NetworkConfig,
    NonNegFloat,
    ParamServerConfig,
    PosFloat,
    PosInt,
    ReplayConfig,
    SecurityConfig,
    Strict,
    TableConfig,
)

__all__ = [
    "ENV_PREFIX",
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "AtariConfig",
    "EnvConfig",
    "EvaluatorConfig",
    "Experiment",
    "LearnerConfig",
    "LoggingConfig",
    "MetricsConfig",
    "NetworkConfig",
    "NonNegFloat",
    "ParamServerConfig",
    "PosFloat",
    "PosInt",
    "ReplayConfig",
    "SecurityConfig",
    "Strict",
    "TableConfig",
    "bind_address",
    "cli_overrides",
    "dump",
    "env_overrides",
    "format_errors",
    "load",
    "validate",
]
