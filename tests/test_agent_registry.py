"""The coordinator's agent registry: indices in order of registration, the smallest free index first, a released
index reused, look-ups by id and by index agree, and a checkpointed registry restores both maps."""

from __future__ import annotations

from fedge.protocol.registry import AgentRegistry


def test_indices_are_assigned_smallest_free_first_and_a_released_one_is_reused() -> None:
    registry = AgentRegistry(capacity=4, liveness_s=10.0)
    assert [registry.index_of(f"a{i}") for i in range(4)] == [0, 1, 2, 3]
    assert registry.index_of("late") is None  # the session is full
    assert registry.release("a1") and registry.get("a1") is None
    assert registry.index_of("b") == 1 and registry.by_index(1).client_id == "b"
    registry.by_index(2).last_accepted_round = 3
    assert not registry.release("a2")  # it has trained: it keeps its index
    assert all(registry.by_index(agent.index) is agent for agent in registry.agents.values())


def test_a_restored_registry_finds_agents_by_index_and_assigns_the_remaining_indices() -> None:
    first = AgentRegistry(capacity=5, liveness_s=10.0)
    for name in ("x", "y", "z"):
        first.index_of(name)
    first.release("y")
    restored = AgentRegistry(capacity=5, liveness_s=10.0)
    restored.load_state(first.state())
    assert restored.by_index(2).client_id == "z" and restored.by_index(0).client_id == "x"
    assert [restored.index_of(name) for name in ("p", "q", "r", "s")] == [1, 3, 4, None]
