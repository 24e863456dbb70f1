"""pFedLA's hypernetwork (docs/algorithms.md section 6) and the arithmetic around it: layer weights, mixing, the HN step.

One ``HyperNetwork`` per client maps its embedding v_i (a parameter) through three Linear + ReLU layers to one head per
aggregation layer; head l gives the raw, non-negative row r_i^l over the N clients, which ``normalise`` turns into
alpha_i^l = r / sum r (one-hot on i when the row is all zero). ``mix`` forms theta_bar^l = sum_j alpha^{l,j} theta_j^l;
``weight_gradient`` is the derivative of 1/2 ||theta_bar - theta_trained||^2 with respect to alpha, and ``descend``
carries it through the network with autograd and takes one plain SGD step on psi and v (gradient descent on that
surrogate; docs/algorithms.md gives the sign). Works in any float dtype (float64 for the finite-difference check). Knows
nothing of models, payloads or the wire.

Initialisation (docs/algorithms.md section 6.2): the MLP's Linear layers use torch's default init law
(U(+-1/sqrt(fan_in)) for weight and bias), the embedding N(0, 1) as torch's nn.Embedding, the heads' weights
U(0, 1), all drawn from a generator seeded per client, so the coordinator's hypernetworks do not depend on the global
torch RNG; each head's bias then makes its row start exactly uniform (``level_heads``), so no random initial
preference decides the rows, while the MLP and the embedding keep their gradients.
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
            self.level_heads()

    @torch.no_grad()
    def level_heads(self) -> None:
        """Set every head's bias so that all its pre-activations are equal at the current psi and v: alpha starts
        exactly uniform (docs/algorithms.md section 6.2). b_j = max_k(w_k f) - w_j f >= 0 with f the
        MLP's output; a second pass absorbs the last bits of float rounding, so the raw row is exactly constant."""
        features = self.mlp(self.embedding)
        for head in self.heads:
            assert isinstance(head, nn.Linear)
            head.bias.zero_()
            for _ in range(4):
                raw = head(features)
                if bool(torch.all(raw == raw.max())):
                    break
                head.bias.add_(raw.max() - raw)

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


def descend(network: HyperNetwork, alpha: torch.Tensor, grad_alpha: np.ndarray, lr: float,
            max_alpha_change: float = 0.0, self_index: int = 0) -> float:
    """One plain SGD step psi <- psi - lr (d alpha / d psi)^T grad_alpha on every parameter, the embedding included.

    With ``max_alpha_change`` > 0 (the optional guard; docs/algorithms.md) the step is shortened, by backtracking
    on its length, until no entry of the normalised alpha (rows over ``self_index``'s clients, every layer) moves by
    more than that. Returns the factor the step was scaled by (1.0: the full step)."""
    backpropagate(network, alpha, grad_alpha)
    steps = [(p, p.grad) for p in network.parameters() if p.grad is not None]
    network.zero_grad(set_to_none=True)
    with torch.no_grad():
        if max_alpha_change <= 0:
            for parameter, grad in steps:
                parameter.sub_(grad, alpha=lr)
            return 1.0
        before = normalise(network(), self_index)
        start = [parameter.detach().clone() for parameter, _ in steps]
        scale = 1.0
        for _ in range(60):
            for (parameter, grad), origin in zip(steps, start, strict=True):
                parameter.copy_(origin).sub_(grad, alpha=lr * scale)
            change = float((normalise(network(), self_index) - before).abs().max())
            if change <= max_alpha_change:
                return scale
            scale *= min(0.5, 0.9 * max_alpha_change / change)
        for parameter, origin in zip((p for p, _ in steps), start, strict=True):
            parameter.copy_(origin)
        return 0.0
