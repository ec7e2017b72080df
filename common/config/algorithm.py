"""The algorithm's section of the experiment file (``algorithm:``): one class per
algorithm, told apart by ``name``, gathered from the algorithm folders
(``common/algorithms/<name>/config.py``), so adding an algorithm needs no edit here.

Each config class declares ``table_kinds`` (a ClassVar): the replay table kinds
the algorithm can learn from, which the experiment checks; and ``per_rank_fields``:
its global batch sizes, which several learners share equally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, Union

from pydantic import Field

from rlfleet.common.algorithms.registry import config_classes, get


class AlgorithmSection(Protocol):
    """What every algorithm's config class has (for type checkers; the classes are pydantic models)."""

    table_kinds: ClassVar[tuple[str, ...]]
    per_rank_fields: ClassVar[tuple[str, ...]]
    name: str

    def check_fleet(self, sync: str, actors: int, num_envs: int, steps_per_round: int) -> list[str]: ...

    def trains_with_workers(self) -> bool: ...

    # Any other field is the algorithm's own (services should ask the algorithm, not read them).
    def __getattr__(self, field: str) -> Any: ...


if TYPE_CHECKING:
    AlgorithmConfig = AlgorithmSection
else:
    AlgorithmConfig = Annotated[Union[tuple(config_classes())], Field(discriminator="name")]  # noqa: UP007


def algorithm_class(name: str) -> Any:
    """The config class of algorithm ``name`` (None if there is none): for error messages."""
    return next((cls for cls in config_classes() if cls.model_fields["name"].default == name), None)


def default_algorithm() -> Any:
    """The algorithm section when the file has none: DQN with its defaults."""
    return get("dqn").config()
