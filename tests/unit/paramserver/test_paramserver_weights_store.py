"""WeightsStore alone: the last two versions of each model, and what a publish must be to be stored."""

from __future__ import annotations

import numpy as np
import pytest

from harness.paramserver_fakes import publish
from rlfleet.common.wire.errors import RequestError
from rlfleet.services.paramserver.weights_store import MAX_NAMED_MODELS, Held, WeightsStore


def store_publish(store: WeightsStore, version: int, model: str | None = None) -> list[int]:
    msg = publish(version, model=model)
    m = store.model_of(msg)
    layout = store.check_publish(m, msg)
    return store.keep(m, Held(version, dict(msg.arrays), layout.fingerprint), layout)


def test_it_keeps_the_last_two_versions_newest_first_and_says_which_it_dropped() -> None:
    store = WeightsStore(0, 1)
    assert store.versions == [] and store.default.layout is None
    assert store_publish(store, 1) == []
    assert store_publish(store, 2) == []
    assert store_publish(store, 5) == [1]
    assert store.versions == [5, 2]
    assert float(store.default.held[0].arrays["w"][0, 0]) == 5


def test_a_publish_not_newer_than_the_newest_or_negative_is_stale() -> None:
    store = WeightsStore(0, 1)
    store_publish(store, 3)
    for version in (3, 2, -1):
        with pytest.raises(RequestError) as err:
            store.check_publish(store.default, publish(version, value=9))
        assert err.value.reason == "stale_version"
    with pytest.raises(RequestError) as err:
        store.check_publish(WeightsStore(0, 1).default, publish(-1))
    assert err.value.reason == "stale_version"


def test_a_publish_of_another_layout_or_shard_count_is_refused() -> None:
    store = WeightsStore(0, 1)
    store_publish(store, 1)
    other = publish(2)
    other.arrays = {"w": np.zeros((4, 4), np.float32)}
    other.body["layout"] = "another"
    with pytest.raises(RequestError) as err:
        store.check_publish(store.default, other)
    assert err.value.reason == "layout_mismatch"
    with pytest.raises(RequestError) as err:
        WeightsStore(0, 2).check_publish(WeightsStore(0, 2).default, publish(1))
    assert err.value.reason == "layout_mismatch"


def test_a_retry_is_the_newest_version_with_the_same_bytes() -> None:
    store = WeightsStore(0, 1)
    assert not store.is_retry(store.default, publish(1))
    store_publish(store, 1)
    assert store.is_retry(store.default, publish(1))
    assert not store.is_retry(store.default, publish(1, value=7))
    assert not store.is_retry(store.default, publish(2))


def test_named_models_are_kept_apart_and_only_once_stored() -> None:
    store = WeightsStore(0, 1)
    unknown = store.model_of(publish(1, model="dynamics"))
    assert unknown.versions == [] and "dynamics" not in store.models  # a read does not create it
    store_publish(store, 7, model="dynamics")
    store_publish(store, 1)
    assert store.models["dynamics"].versions == [7] and store.versions == [1]
    for i in range(MAX_NAMED_MODELS - 1):  # "dynamics" is the first
        store_publish(store, 1, model=f"m{i}")
    with pytest.raises(RequestError) as err:
        store_publish(store, 1, model="onetoomany")
    assert err.value.reason == "bad_field"


def test_a_bad_model_name_is_a_bad_field() -> None:
    with pytest.raises(RequestError) as err:
        WeightsStore(0, 1).model_of(publish(1, model=""))
    assert err.value.reason == "bad_field"
