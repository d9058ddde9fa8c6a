"""The one cost model: how long a forward of a model takes on a piece of hardware.

A forward over a batch of sequences, each appending `new` tokens to `context` tokens already
cached, on `tp` devices sharing the model by tensor parallelism, costs (in the manner of
Vidur and LLM-Viewer):

    matmul    = params - idle_params - [untied] vocab x hidden  (the input embedding: a lookup)
    bytes     = ((matmul - head) x bytes_per_param + head x head_bytes_per_param
                 + kv_bytes_per_token x sum(context + new)) / tp
                                      (head = vocab x hidden, the output head's matrix)
    attention = sum over sequences of
                4 x layers x heads x head_dim x new x (context + (new + 1) / 2)
    t_mem     = bytes / (bandwidth x bw_efficiency)
    t_cmp     = (2 x matmul x sum(new) / flops_efficiency + attention / attention_efficiency)
                / (tp x peak)                    (attention_efficiency 0: flops_efficiency)
    t         = step_overhead + layers x layer_overhead + sequences x seq_overhead
                + sum(new) x token_overhead + [sequences > 1] batched_overhead
                + (t_mem^k + t_cmp^k)^(1/k)       (a smooth roofline, k = sharpness)
                + [tp > 1] 2 x layers
                           x (allreduce_latency + 2 (tp-1)/tp x sum(new) x hidden x 2 B / link)

kv_bytes_per_token = 2 x layers x kv_heads x head_dim x 2 B (f16 keys and values).
Bandwidth, peak FLOP/s and memory are the hardware's published figures (per device); the
efficiencies, overheads and sharpness are fitted per hardware to published and measured step
times (`topologies/hardware.yaml`, docs/hardware.md). A plain roofline (efficiencies 1, no
overheads, a hard max) makes a 70B server about 2.6x too fast and loses its flat batch
curve; the overheads and the smooth maximum keep it. `idle_params` are held in memory but not
run by a text-only forward (a vision model's encoder and cross-attention layers): they count
towards `weight_bytes` (what must fit) only.

Nothing here imports the controller: the agents pace their engine calls with it
(`agents.emulation.pacing`) from the hardware and model the controller hands them as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

GB = 1e9
KV_BYTES_PER_ELEMENT = 2.0  # f16 keys and values, whatever the weights' format


R = TypeVar("R", bound="Record")


class Record:
    """A dataclass the controller hands the agents as JSON: to and from a dict of fields."""

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """An instance from the fields in `data` (other keys ignored)."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in known})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class Hardware(Record):
    """One machine a lab host stands for: published figures and fitted efficiencies."""

    name: str
    memory_gb: float  # per device: GPU memory, or RAM (a Jetson's is shared with its GPU)
    bandwidth_gbs: float  # per device, peak memory bandwidth
    peak_tflops: float  # per device, dense, at the compute type of its engine
    devices: int = 1  # GPUs holding one model by tensor parallelism
    link_gbs: float = 0.0  # per device, all-reduce bandwidth (NVLink); tp > 1 only
    allreduce_latency_us: float = 0.0  # per all-reduce; tp > 1 only
    bw_efficiency: float = 1.0  # fitted: share of peak bandwidth reached
    flops_efficiency: float = 1.0  # fitted: share of peak FLOP/s reached by the matmuls
    attention_efficiency: float = 0.0  # fitted: the same for attention; 0: flops_efficiency
    step_overhead_ms: float = 0.0  # fitted: fixed per forward (launch, scheduling, sampling)
    layer_overhead_us: float = 0.0  # fitted: per layer per forward (kernel launches)
    seq_overhead_us: float = 0.0  # fitted: per sequence of the batch
    token_overhead_us: float = 0.0  # fitted: per new token (its logits to the host, sampling)
    batched_overhead_ms: float = 0.0  # fitted: per forward of 2+ sequences (padding, gathering)
    sharpness: float = 2.0  # fitted: k of the smooth roofline max

    @property
    def memory_bytes(self) -> float:
        """Memory of all devices together."""
        return self.memory_gb * GB * self.devices


@dataclass(frozen=True)
class ModelShape(Record):
    """A Llama-architecture model in one weight format."""

    name: str
    params: float  # every parameter, embeddings included
    layers: int  # the layers a text token passes through
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bytes_per_param: float  # of the weight format (q4_0 4.5 bits: 0.5625)
    tied_embeddings: bool = False
    idle_params: float = 0.0  # held in memory, not run by a text-only forward
    # the output head's matrix as the format's files store it (a Q4_0 GGUF keeps it at Q6_K,
    # 6.5625 bits: 0.8203); None: the format's bytes_per_param
    head_bytes_per_param: float | None = None

    @property
    def head_params(self) -> float:
        """The output head's matrix (tied embeddings: the token embedding too)."""
        return self.vocab * self.hidden

    @property
    def head_extra_bytes(self) -> float:
        """Bytes the head takes beyond what the format's bytes_per_param would give it."""
        if self.head_bytes_per_param is None:
            return 0.0
        return self.head_params * (self.head_bytes_per_param - self.bytes_per_param)

    @property
    def weight_bytes(self) -> float:
        """Bytes the weights take in memory."""
        return self.params * self.bytes_per_param + self.head_extra_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_BYTES_PER_ELEMENT

    @property
    def matmul_params(self) -> float:
        """Parameters a token passes through in matrix products (the input embedding is a
        lookup; tied embeddings are still the output head's matrix)."""
        embedding = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.params - self.idle_params - embedding

    @property
    def streamed_bytes(self) -> float:
        """Weight bytes one forward reads: its matrices (the head at its own format), once."""
        return self.matmul_params * self.bytes_per_param + self.head_extra_bytes


Batch = Sequence[tuple[int, int]]
"""A forward's sequences: (new tokens, context tokens already cached) each."""


@dataclass(frozen=True)
class StepTime:
    """One forward's modelled time and its parts (seconds)."""

    seconds: float
    memory_s: float
    compute_s: float
    overhead_s: float
    allreduce_s: float


def smooth_max(a: float, b: float, k: float) -> float:
    """(a^k + b^k)^(1/k) for a, b >= 0, computed without underflow."""
    top = max(a, b)
    if top <= 0:
        return 0.0
    return top * ((a / top) ** k + (b / top) ** k) ** (1 / k)


def step_time(hw: Hardware, model: ModelShape, batch: Batch) -> StepTime:
    """The modelled time of one forward of `model` over `batch` on `hw` (module docstring)."""
    tp = max(1, hw.devices)
    new = sum(n for n, _ in batch)
    cached = sum(c + n for n, c in batch)
    bytes_moved = (model.streamed_bytes + model.kv_bytes_per_token * cached) / tp
    attention = sum(
        4 * model.layers * model.heads * model.head_dim * n * (c + (n + 1) / 2) for n, c in batch
    )
    peak = hw.peak_tflops * 1e12 * tp  # all devices together
    t_mem = bytes_moved / (hw.bandwidth_gbs * GB * hw.bw_efficiency)
    t_cmp = 2 * model.matmul_params * new / (peak * hw.flops_efficiency) + attention / (
        peak * (hw.attention_efficiency or hw.flops_efficiency)
    )
    core = smooth_max(t_mem, t_cmp, hw.sharpness)
    overhead = (
        hw.step_overhead_ms / 1e3
        + model.layers * hw.layer_overhead_us / 1e6
        + len(batch) * hw.seq_overhead_us / 1e6
        + new * hw.token_overhead_us / 1e6
        + (hw.batched_overhead_ms / 1e3 if len(batch) > 1 else 0.0)
    )
    allreduce = 0.0
    if tp > 1:
        message = 2 * (tp - 1) / tp * new * model.hidden * 2
        per = hw.allreduce_latency_us / 1e6 + (message / (hw.link_gbs * GB) if hw.link_gbs else 0)
        allreduce = 2 * model.layers * per
    return StepTime(core + overhead + allreduce, t_mem, t_cmp, overhead, allreduce)


def step_seconds(hw: Hardware, model: ModelShape, batch: Batch) -> float:
    """`step_time(...).seconds`."""
    return step_time(hw, model, batch).seconds


def decode_seconds(hw: Hardware, model: ModelShape, batch: int, context: int) -> float:
    """One decoding step of `batch` sequences, one new token each after `context` tokens."""
    return step_seconds(hw, model, [(1, context)] * batch)


def prefill_seconds(hw: Hardware, model: ModelShape, tokens: int) -> float:
    """The prefill of one prompt of `tokens` tokens."""
    return step_seconds(hw, model, [(tokens, 0)])
