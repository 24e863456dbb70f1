"""pFedLA's hypernetwork (ALGORITHMS.md 6.2) and the arithmetic around it: layer weights, mixing, the HN step.

One ``HyperNetwork`` per client maps its embedding v_i (a parameter) through three Linear + ReLU layers to one head per
aggregation layer; head l gives the raw, non-negative row r_i^l over the N clients, which ``normalise`` turns into
alpha_i^l = r / sum r (one-hot on i when the row is all zero). ``mix`` forms theta_bar^l = sum_j alpha^{l,j} theta_j^l;
``weight_gradient`` is the derivative of 1/2 ||theta_bar - theta_trained||^2 with respect to alpha, and ``descend``
carries it through the network with autograd and takes one plain SGD step on psi and v (gradient descent on that
surrogate; ALGORITHMS.md 6.3's sign). Works in any float dtype (float64 for the finite-difference check). Knows
nothing of models, payloads or the wire.

Decisions where ALGORITHMS.md is silent: the MLP's Linear layers use torch's default init law
(U(+-1/sqrt(fan_in)) for weight and bias) and the embedding N(0, 1) as torch's nn.Embedding, all drawn from a
generator seeded per client, so the coordinator's hypernetworks do not depend on the global torch RNG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn


class HyperNetwork(nn.Module):
    """v_i -> 3 x (Linear + ReLU) -> one ReLU head of N outputs per layer; forward() is the raw (L, N) matrix."""

    def __init__(self, num_clients: int, num_layers: int, embedding_dim: int = 100, hidden_dim: int = 100,
                 seed: int = 0) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(embedding_dim))
        self.mlp = nn.Sequential(
            nn.Linear(embedding_dim, hidden_dim), nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim), nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim), nn.ReLU(),
        )
        heads = [nn.Linear(hidden_dim, num_clients) for _ in range(num_layers)]
        self.heads = nn.ModuleList(heads)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.embedding.normal_(generator=generator)
            for layer in self.mlp:
                if isinstance(layer, nn.Linear):
                    bound = 1 / math.sqrt(layer.in_features)
                    layer.weight.uniform_(-bound, bound, generator=generator)
                    layer.bias.uniform_(-bound, bound, generator=generator)
            for head in heads:
                head.weight.uniform_(0.0, 1.0, generator=generator)
                head.bias.zero_()

    def forward(self) -> torch.Tensor:
        features = self.mlp(self.embedding)
        return torch.stack([torch.relu(head(features)) for head in self.heads])


def normalise(raw: torch.Tensor, self_index: int) -> torch.Tensor:
    """Rows r / sum r; a row that sums to 0 becomes one-hot on ``self_index`` (and carries no gradient)."""
    sums = raw.sum(dim=1, keepdim=True)
    positive = sums > 0
    one_hot = torch.zeros_like(raw)
    one_hot[:, self_index] = 1.0
    return torch.where(positive, raw / torch.where(positive, sums, torch.ones_like(sums)), one_hot)


def layer_weights(network: HyperNetwork, self_index: int, retain: int = 0) -> tuple[torch.Tensor, list[int]]:
    """alpha_i (L, N) with autograd, and the ``retain`` layers of largest normalised self-weight (HeurpFedLA),
    whose rows are replaced by a detached one-hot on i. Ties go to the lower layer index."""
    alpha = normalise(network(), self_index)
    if retain <= 0:
        return alpha, []
    self_weight = alpha[:, self_index].detach().cpu().numpy()
    retained = sorted(int(row) for row in np.argsort(-self_weight, kind="stable")[:retain])
    mask = torch.zeros(alpha.shape[0], 1, dtype=torch.bool)
    mask[retained] = True
    one_hot = torch.zeros_like(alpha)
    one_hot[:, self_index] = 1.0
    return torch.where(mask, one_hot, alpha), retained


def mix(weights: np.ndarray, stack: np.ndarray) -> np.ndarray:
    """sum_j w_j stack[j], accumulated in float64 one client at a time (memory O(one model)), returned in the
    stack's dtype; zero weights are skipped, so a one-hot row returns its client's tensor exactly."""
    total = np.zeros(stack.shape[1:], dtype=np.float64)
    for weight, row in zip(weights.tolist(), stack, strict=True):
        if weight != 0.0:
            total += weight * row.astype(np.float64)
    return total.astype(stack.dtype)


def weight_gradient(stacks: Sequence[Sequence[np.ndarray]], residuals: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """d/d alpha of 1/2 sum_l ||sum_j alpha^{l,j} theta_j^l - target^l||^2 given the residuals theta_bar - target:
    entry (l, j) = sum over layer l's tensors of <theta_j, residual>. ``stacks[l]`` holds (N, ...) arrays."""
    rows = []
    for layer_stacks, layer_residuals in zip(stacks, residuals, strict=True):
        row = np.zeros(layer_stacks[0].shape[0], dtype=np.float64)
        for stack, residual in zip(layer_stacks, layer_residuals, strict=True):
            flat = residual.reshape(-1).astype(np.float64)
            row += [float(np.dot(client.reshape(-1).astype(np.float64), flat)) for client in stack]
        rows.append(row)
    return np.stack(rows)


def backpropagate(network: HyperNetwork, alpha: torch.Tensor, grad_alpha: np.ndarray) -> None:
    """Set every parameter's .grad to (d alpha / d psi)^T grad_alpha, the vector-Jacobian product by autograd."""
    network.zero_grad(set_to_none=True)
    torch.autograd.backward(alpha, torch.as_tensor(grad_alpha, dtype=alpha.dtype))


def descend(network: HyperNetwork, alpha: torch.Tensor, grad_alpha: np.ndarray, lr: float) -> None:
    """One plain SGD step psi <- psi - lr (d alpha / d psi)^T grad_alpha on every parameter, the embedding included."""
    backpropagate(network, alpha, grad_alpha)
    with torch.no_grad():
        for parameter in network.parameters():
            if parameter.grad is not None:
                parameter.sub_(parameter.grad, alpha=lr)
    network.zero_grad(set_to_none=True)
