"""The hardware-and-model catalogue (`topologies/hardware.yaml`): data a lab engineer extends.

    sources:   {splitwise: "Patel et al., ...", ...}          # cited by calibration points
    formats:   {q4_0: {bits: 4.5, source: ..., files: [...]}, ...}  # bits per weight; published
                                                              # files' sizes check them
    models:    {llama-3.2-1b: {params, layers, hidden, ffn, heads, kv_heads, head_dim, vocab,
                               tied_embeddings, source}, ...}
    hardware:  {pi5: {description, memory_gb, bandwidth_gbs, peak_tflops, devices, source,
                      fit: {...}, fitted: [...], priors: ..., calibration: [...]}, ...}

A model is named with its weight format, `<model>@<format>` (`llama-3.2-1b@q4_0`). A hardware
entry's `fit` holds the efficiencies and overheads of the cost model
(`agents.emulation.stepcost`); `fitted` names those its `calibration` points determined
(`testbed bench hardware --fit`), the rest are priors explained in `priors`. An entry with
`fit_from: other` takes every fit value it does not set from `other`. The runtime never fits:
it reads these numbers. Errors name the file, the key and what was expected.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from agents.emulation.stepcost import GB, Hardware, ModelShape
from testbed.core.errors import BadInputError
from testbed.core.loading import read_yaml, validate
from testbed.core.paths import REPO_ROOT

DEFAULT_PATH = REPO_ROOT / "topologies" / "hardware.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishedFile(_Strict):
    """A published weight file of one model in a format: its size gives the bits per weight
    the format really takes (`effective_bits`), tensors kept at higher precision included."""

    model: str  # a key of the catalogue's `models`
    bytes: int = Field(gt=0)  # the file's size as published
    source: str  # a key of the file's `sources`
    miss: str | None = None  # why the format's bits differ from the file's, where they do


class WeightFormat(_Strict):
    bits: float = Field(gt=0, le=64)  # per weight, scales included
    # the output head's matrix (or the tied token embedding) as the format's files keep it,
    # where they keep it apart (llama.cpp's Q4_0: Q6_K); unset: `bits`
    head_bits: float | None = Field(None, gt=0, le=64)
    source: str
    files: list[PublishedFile] = []  # published files in this format (a check of `bits`)

    @property
    def bytes_per_param(self) -> float:
        return self.bits / 8

    @property
    def head_bytes_per_param(self) -> float | None:
        return None if self.head_bits is None else self.head_bits / 8


class ModelEntry(_Strict):
    """A Llama-architecture model's published shape."""

    params: int = Field(gt=0)
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    ffn: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab: int = Field(ge=1)
    tied_embeddings: bool
    idle_params: int = Field(0, ge=0)
    source: str
    note: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads")
        if self.idle_params >= self.params:
            raise ValueError("idle_params must be fewer than params")
        return self


class FitValues(_Strict):
    """The fitted (or prior) part of a Hardware; unset values come from `fit_from`."""

    bw_efficiency: float | None = Field(None, gt=0, le=1)
    flops_efficiency: float | None = Field(None, gt=0, le=1)
    attention_efficiency: float | None = Field(None, ge=0, le=1)
    step_overhead_ms: float | None = Field(None, ge=0, allow_inf_nan=False)
    layer_overhead_us: float | None = Field(None, ge=0, allow_inf_nan=False)
    seq_overhead_us: float | None = Field(None, ge=0, allow_inf_nan=False)
    token_overhead_us: float | None = Field(None, ge=0, allow_inf_nan=False)
    batched_overhead_ms: float | None = Field(None, ge=0, allow_inf_nan=False)
    sharpness: float | None = Field(None, ge=1, le=64)


FIT_FIELDS = tuple(FitValues.model_fields)


class CalibrationPoint(_Strict):
    """A measured forward: `batch` sequences of `new` tokens after `context` cached ones."""

    model: str  # <model>@<format>
    batch: int = Field(ge=1)
    new: int = Field(ge=1)
    context: int = Field(ge=0)
    ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    tok_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # batch x new per second
    source: str  # a key of the file's `sources`
    excluded: str | None = None  # why the fit leaves it out (shown, not fitted)
    # held out: never used by the fit, only judged (an out-of-sample check of the model)
    held_out: StrictBool = False
    miss: str | None = None  # why the model misses this point by more than the goal, if it does

    @model_validator(mode="after")
    def _one_figure(self) -> CalibrationPoint:
        if (self.ms is None) == (self.tok_s is None):
            raise ValueError("give exactly one of ms and tok_s")
        return self

    @property
    def measured_ms(self) -> float:
        if self.ms is not None:
            return self.ms
        return 1000 * self.batch * self.new / (self.tok_s or math.nan)

    @property
    def shape(self) -> list[tuple[int, int]]:
        """The forward's sequences as `agents.emulation.stepcost.Batch`."""
        return [(self.new, self.context)] * self.batch


class HardwareEntry(_Strict):
    description: str
    memory_gb: float = Field(gt=0, allow_inf_nan=False)  # per device
    bandwidth_gbs: float = Field(gt=0, allow_inf_nan=False)  # per device
    peak_tflops: float = Field(gt=0, allow_inf_nan=False)  # per device, dense
    devices: int = Field(1, ge=1, le=64)
    link_gbs: float = Field(0, ge=0, allow_inf_nan=False)
    allreduce_latency_us: float = Field(0, ge=0, allow_inf_nan=False)
    source: str
    fit_from: str | None = None
    fit: FitValues = FitValues()
    fitted: list[str] = []
    priors: str = ""
    calibration: list[CalibrationPoint] = []


class CatalogueFile(_Strict):
    sources: dict[str, str] = Field(min_length=1)  # citation of each calibration source
    formats: dict[str, WeightFormat] = Field(min_length=1)
    models: dict[str, ModelEntry] = Field(min_length=1)
    hardware: dict[str, HardwareEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> CatalogueFile:
        for fmt_name, fmt in self.formats.items():
            for i, file in enumerate(fmt.files):
                where = f"formats.{fmt_name}.files.{i}"
                if file.model not in self.models:
                    raise ValueError(f"{where}.model: {unknown('model', file.model, self.models)}")
                if file.source not in self.sources:
                    known = unknown("source", file.source, self.sources)
                    raise ValueError(f"{where}.source: {known}")
        for name, hw in self.hardware.items():
            key = f"hardware.{name}"
            if hw.fit_from is not None:
                base = self.hardware.get(hw.fit_from)
                if base is None:
                    raise ValueError(
                        f"{key}.fit_from: {unknown('hardware', hw.fit_from, self.hardware)}"
                    )
                if base.fit_from is not None:
                    raise ValueError(
                        f"{key}.fit_from: {hw.fit_from!r} takes its own fit from another entry"
                    )
            else:
                missing = [f for f in FIT_FIELDS if getattr(hw.fit, f) is None]
                if missing:
                    raise ValueError(f"{key}.fit: missing {', '.join(missing)} (or give fit_from)")
            for field in hw.fitted:
                if field not in FIT_FIELDS:
                    raise ValueError(
                        f"{key}.fitted: {field!r} is not one of {', '.join(FIT_FIELDS)}"
                    )
            for i, point in enumerate(hw.calibration):
                split_ref(point.model, self, f"{key}.calibration.{i}.model")
                if point.source not in self.sources:
                    where = f"{key}.calibration.{i}.source"
                    raise ValueError(f"{where}: {unknown('source', point.source, self.sources)}")
        return self


def unknown(kind: str, name: str, known: dict) -> str:
    return f"unknown {kind} {name!r} (known: {', '.join(known)})"


def split_ref(ref: str, spec: CatalogueFile, where: str) -> tuple[ModelEntry, WeightFormat]:
    """The model and format of `<model>@<format>`; ValueError naming `where` otherwise."""
    name, at, fmt = ref.partition("@")
    if not at or not name or not fmt:
        raise ValueError(
            f"{where}: model {ref!r}: expected '<model>@<format>', e.g. llama-3.2-1b@q4_0"
        )
    if name not in spec.models:
        raise ValueError(f"{where}: {unknown('model', name, spec.models)}")
    if fmt not in spec.formats:
        raise ValueError(f"{where}: model {ref!r}: {unknown('format', fmt, spec.formats)}")
    return spec.models[name], spec.formats[fmt]


def effective_bits(spec: CatalogueFile, file: PublishedFile) -> float:
    """Bits per parameter of a published file: its bytes x 8 over the model's parameters."""
    return file.bytes * 8 / spec.models[file.model].params


def llama_params(m: ModelEntry) -> int:
    """Parameters of a plain Llama decoder of m's shape (embeddings, layers, norms, head)."""
    attention = m.hidden * m.heads * m.head_dim * 2 + m.hidden * m.kv_heads * m.head_dim * 2
    layer = attention + 3 * m.hidden * m.ffn + 2 * m.hidden
    embeddings = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    return m.layers * layer + embeddings + m.hidden


def shared_fields(record: type, entry: BaseModel) -> dict[str, Any]:
    """The values of `entry` that the dataclass `record` also has a field for."""
    names = {f.name for f in fields(record)} & set(type(entry).model_fields)
    return entry.model_dump(include=names)


def display(path: Path) -> str:
    """path as the user would name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Catalogue:
    """A loaded catalogue: hardware and models as the cost model's records."""

    path: Path
    spec: CatalogueFile

    @property
    def source(self) -> str:
        return display(self.path)

    def entry(self, name: str, source: str) -> HardwareEntry:
        if name not in self.spec.hardware:
            raise BadInputError(f"{source}: {unknown('hardware', name, self.spec.hardware)}")
        return self.spec.hardware[name]

    def fit_values(self, name: str, source: str) -> dict[str, float]:
        """Every fit value of `name`, those it does not set taken from its `fit_from`."""
        hw = self.entry(name, source)
        base = self.spec.hardware[hw.fit_from].fit if hw.fit_from else FitValues()
        own = hw.fit.model_dump(exclude_none=True)
        return {**base.model_dump(exclude_none=True), **own}

    def hardware(self, name: str, source: str) -> Hardware:
        """The cost model's Hardware for entry `name` (`source` names who asked)."""
        figures = shared_fields(Hardware, self.entry(name, source))
        return Hardware(name=name, **figures, **self.fit_values(name, source))

    def model(self, ref: str, source: str) -> ModelShape:
        """The cost model's ModelShape for `<model>@<format>`."""
        try:
            m, fmt = split_ref(ref, self.spec, source)
        except ValueError as exc:
            raise BadInputError(str(exc)) from None
        shape = shared_fields(ModelShape, m)
        return ModelShape(
            name=ref,
            bytes_per_param=fmt.bytes_per_param,
            head_bytes_per_param=fmt.head_bytes_per_param,
            **shape,
        )

    def check_fits(self, hw_name: str, refs: list[str], source: str, kv_tokens: int = 0) -> None:
        """BadInputError unless the weights of `refs` (and `kv_tokens` tokens of KV cache for
        each) fit in the memory of all of `hw_name`'s devices together."""
        hw = self.hardware(hw_name, source)
        shapes = [self.model(ref, source) for ref in refs]
        needed = sum(m.weight_bytes + m.kv_bytes_per_token * kv_tokens for m in shapes)
        if needed > hw.memory_bytes:
            kv = f" with KV cache for {kv_tokens:,} tokens" if kv_tokens else ""
            raise BadInputError(
                f"{source}: {' + '.join(refs)}{kv} need {needed / GB:.1f} GB, more than the "
                f"{hw.memory_bytes / GB:.1f} GB of {hw_name} ({hw.devices} x {hw.memory_gb:g} GB)"
            )


def load_catalogue(path: Path = DEFAULT_PATH) -> Catalogue:
    """Read and validate the catalogue at path (cached until the file changes)."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = -1  # read_yaml reports it
    return _load(path.resolve(), stamp)


@functools.lru_cache(maxsize=8)
def _load(path: Path, stamp: int) -> Catalogue:
    source = display(path)
    return Catalogue(path, validate(CatalogueFile, read_yaml(path), source))
