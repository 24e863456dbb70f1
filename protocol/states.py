"""The one rule every named state of the protocol follows: a move is looked up in its transition table, and a move
the table does not list raises ``Transition`` naming who could not do what. Imports nothing."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

State = TypeVar("State", bound=enum.Enum)


class Transition(RuntimeError):
    """A transition that the table does not allow."""


def next_state(table: Mapping[tuple[State, str], State], state: State, event: str, who: str) -> State:
    """``table``'s next state for ``event`` in ``state``; ``who`` names the mover in the refusal."""
    try:
        return table[(state, event)]
    except KeyError:
        raise Transition(f"{who} cannot {event} when it is {state.value}") from None
