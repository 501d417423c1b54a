"""HF checkpoints straight onto a device mesh: every process reads only the slices its own devices hold.

:func:`load_hf_sharded` builds each parameter from per-device arrays (``make_array_from_single_device_arrays``):
for every distinct block of the parameter that this process's devices hold, it reads just the matching rectangle
of the HF tensor (or of each layer's tensor, for the stacked ``[L, ...]`` weights) at its exact byte ranges in the
safetensors file (:class:`_Rectangles`; the library lists the tensors and checks shapes and dtypes), converts it
to our layout and the preset's storage dtype, puts it on the device(s) holding that block and drops it before
reading the next. So no process reads or holds a block it does not need, host memory stays at the process's own
blocks plus the one being read, and no parameter exists whole on one device.

:func:`load_hf_checkpoint` (``hf_io``) is the whole-model reader kept beside it (tests compare the two bit for
bit; the servers and the embedded engine use it). Our layout of each HF tensor (``kind``):

- ``id``: the same array (embeddings, norms, the MoE ``down_proj`` [E, F, D]);
- ``T``: the transpose of a torch ``Linear`` weight [out, in] (the LM head, the FFN projections, the router);
- ``qkv``: ``[H*Dh, D]`` -> ours ``[D, H, Dh]``; ``o``: ``[D, H*Dh]`` -> ours ``[H, Dh, D]``;
- ``cols``: a column range of the last dimension (Llama-4's fused ``gate_up_proj`` [E, D, 2F]: gate, then up);
- ``bias``: ``[H*Dh]`` -> ours ``[H, Dh]`` (Qwen2's q/k/v biases);
- ``experts``: one torch ``Linear`` weight per expert, ``name`` a template over ``{j}`` (Qwen3-MoE's
  ``mlp.experts.{j}.*_proj.weight``): our ``[E, in, out]`` block reads each of its experts' transposed rectangle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import hf_llama4, hf_qwen
from scalerl_jax.models.hf_io import (
    _DTYPES,
    CheckpointError,
    _collect_tensors,
    _hf_layer_shape,
    layer_map,
    read_hf_config,
)
from scalerl_jax.models.layers import dtype as to_dtype
from scalerl_jax.models.model import param_shapes

_KIND = {"attn_norm": "id", "mlp_norm": "id", "wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "o", "bq": "bias",
         "bk": "bias", "bv": "bias", "q_norm": "id", "k_norm": "id"}


@dataclasses.dataclass(frozen=True)
class Source:
    """Where one of our (per-layer) arrays comes from: HF tensor ``name`` of shape ``hf_shape``, laid out as
    ``kind`` says (module docstring); ``col``: the first column of our block, for ``cols``. For ``experts``,
    ``hf_shape`` is (E, one expert's HF shape)."""

    name: str
    kind: str
    hf_shape: tuple[int, ...]
    col: int = 0


@dataclasses.dataclass
class ReadStats:
    """What a load read from disk in this process: tensor bytes (of the file's dtype) and slice reads."""

    bytes_read: int = 0
    reads: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += int(nbytes)
            self.reads += 1


def sources(cfg: ModelConfig, hf_cfg: dict[str, Any]) -> dict[str, Any]:
    """Our params tree with a :class:`Source` (unstacked weights) or a list of them, one per layer (stacked
    ``[L, ...]`` weights), at each leaf."""
    shapes = param_shapes(cfg)
    prefix = hf_llama4.text_config(hf_cfg)[1] if cfg.arch == "llama4" else ""
    V, D = shapes["embed"]
    out: dict[str, Any] = {"embed": Source(prefix + "model.embed_tokens.weight", "id", (V, D)),
                           "final_norm": Source(prefix + "model.norm.weight", "id", (D,))}
    if not cfg.tie_embeddings:
        out["lm_head"] = Source(prefix + "lm_head.weight", "T", (V, D))

    def per_layer(group: str, key: str, suffix: str, layers, kind: str | None = None) -> list[Source]:
        per = tuple(shapes[group][key][1:])
        k = kind or _KIND.get(key, "T")
        hf = _hf_layer_shape(key, per) if k in ("qkv", "o", "bias") else per if k == "id" else per[::-1]
        return [Source(f"{prefix}model.layers.{i}.{suffix}", k, tuple(hf)) for i in layers]

    if cfg.arch != "llama4":
        out["layers"] = {key: per_layer("layers", key, suffix, range(cfg.n_layers)) for key, suffix in layer_map(cfg)}
        if cfg.is_moe:  # Qwen3-MoE
            moe = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
            dense = [i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)]
            m = {"router": per_layer("moe", "router", "mlp.gate.weight", moe)}
            for key in hf_qwen.EXPERT:
                per = tuple(shapes["moe"][key][1:])  # [E, in, out]
                m[key] = [Source(hf_qwen.expert_name(i, "{j}", key), "experts",
                                 (per[0], per[2], per[1])) for i in moe]
            out["moe"] = m
            if dense:
                out["dense"] = {key: per_layer("dense", key, suffix, dense) for key, suffix in hf_qwen.DENSE}
        return out
    out["layers"] = {key: per_layer("layers", key, suffix, range(cfg.n_layers)) for key, suffix in hf_llama4._ATTN}
    moe = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    dense = [i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)]
    E, Fe = cfg.n_experts, cfg.expert_ffn_dim
    if moe:
        m: dict[str, Any] = {"router": per_layer("moe", "router", "feed_forward.router.weight", moe)}
        gu = "feed_forward.experts.gate_up_proj"
        m["w_gate"] = [Source(f"{prefix}model.layers.{i}.{gu}", "cols", (E, D, 2 * Fe), 0) for i in moe]
        m["w_up"] = [Source(f"{prefix}model.layers.{i}.{gu}", "cols", (E, D, 2 * Fe), Fe) for i in moe]
        m["w_down"] = per_layer("moe", "w_down", "feed_forward.experts.down_proj", moe, kind="id")
        for key, suffix in hf_llama4._SHARED:
            m[key] = per_layer("moe", key, suffix, moe)
        out["moe"] = m
    if dense:
        out["dense"] = {key: per_layer("dense", key, suffix, dense) for key, suffix in hf_llama4._DENSE}
    return out


def _ranges(index: tuple, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """A sharding's block index (slices, possibly open) as (start, stop) per dimension."""
    out = []
    for s, n in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)), shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"strided block {s} of a dimension of size {n}")
        out.append((start, stop))
    return out


class _Rectangles:
    """Rectangles of the tensors in one safetensors file, read with ``os.pread`` at their exact byte ranges.

    The file's layout is the format's: an 8-byte little-endian header length, a JSON header (per tensor: dtype,
    shape, ``data_offsets`` relative to the end of the header), then the row-major data. A rectangle is read as its
    contiguous runs (the innermost dimensions it covers whole, times its range of the next one), straight into the
    result's buffer. Written here because the library's own slice reads either read the whole tensor (its pread
    backend, for any slice) or map the file (its default backend: the touched pages stay resident while open)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        (n,) = np.frombuffer(os.pread(self.fd, 8, 0), "<u8")
        header = json.loads(os.pread(self.fd, int(n), 8))
        self.base = 8 + int(n)
        self.info = {k: v for k, v in header.items() if k != "__metadata__"}

    def close(self) -> None:
        os.close(self.fd)

    def read(self, name: str, ranges: list[tuple[int, int]]) -> np.ndarray:
        meta = self.info[name]
        dt = np.dtype(_DTYPES[meta["dtype"]])
        shape = [int(x) for x in meta["shape"]]
        out = np.empty([b - a for a, b in ranges], dt)
        if out.size == 0:
            return out
        k = len(shape)  # dims k.. are covered whole: each run spans them and dim k-1's range
        while k > 0 and ranges[k - 1] == (0, shape[k - 1]):
            k -= 1
        inner = int(np.prod(shape[k:], dtype=np.int64))
        if k == 0:
            runs, run_elems, lead = [0], inner, []
        else:
            a, b = ranges[k - 1]
            run_elems = (b - a) * inner
            lead = [range(x, y) for x, y in ranges[: k - 1]]
            strides = np.cumprod([1, *shape[::-1]])[::-1][1:]  # elements per step of each dim
            starts = np.zeros(1, np.int64) + a * inner
            for d, r in enumerate(lead):
                starts = (starts[:, None] + np.asarray(r, np.int64)[None, :] * strides[d]).reshape(-1)
            runs = starts
        buf = memoryview(out.reshape(-1).view(np.uint8))
        nbytes = run_elems * dt.itemsize
        begin = self.base + int(meta["data_offsets"][0])
        for i, start in enumerate(runs):
            got = os.preadv(self.fd, [buf[i * nbytes:(i + 1) * nbytes]], begin + int(start) * dt.itemsize) \
                if hasattr(os, "preadv") else _pread_into(self.fd, buf[i * nbytes:(i + 1) * nbytes],
                                                           begin + int(start) * dt.itemsize)
            if got != nbytes:
                raise OSError(f"short read of {name!r}: {got} of {nbytes} bytes at run {i}")
        return out


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    data = os.pread(fd, len(view), offset)
    view[: len(data)] = data
    return len(data)


class _Reader:
    """Rectangle reads from the checkpoint's files, counted in ``stats``; errors name the file and tensor."""

    def __init__(self, path: Path, tensors: dict, stats: ReadStats, files: dict[str, _Rectangles]) -> None:
        self.path, self.tensors, self.stats, self.files = path, tensors, stats, files

    def check(self, src: Source) -> None:
        if src.kind == "experts":
            for j in range(src.hf_shape[0]):
                self.check(Source(src.name.format(j=j), "T", src.hf_shape[1:]))
            return
        if src.name not in self.tensors:
            raise CheckpointError(f"{self.path}: tensor {src.name!r} is missing (expected shape {list(src.hf_shape)})")
        _, fname, found = self.tensors[src.name]
        if tuple(found) != tuple(src.hf_shape):
            raise CheckpointError(f"{self.path}/{fname}: tensor {src.name!r} has shape {list(found)}, expected "
                                  f"{list(src.hf_shape)}")

    def read(self, name: str, ranges: list[tuple[int, int]]) -> np.ndarray:
        _, fname, _ = self.tensors[name]
        try:
            a = self.files[fname].read(name, ranges)
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path}/{fname}: tensor {name!r} is unreadable ({e})") from e
        self.stats.add(a.nbytes)
        return a  # in the file's dtype: the caller casts once, into its block (no float32 copy of a big slice)

    def block(self, src: Source, ours: list[tuple[int, int]], per_shape: tuple[int, ...]) -> np.ndarray:
        """Our block ``ours`` (ranges over our per-layer array of shape ``per_shape``) of ``src``."""
        if src.kind == "id":
            return self.read(src.name, ours)
        if src.kind == "T":
            return self.read(src.name, ours[::-1]).T
        if src.kind == "experts":
            (j0, j1), rest = ours[0], ours[1:]
            return np.stack([self.read(src.name.format(j=j), rest[::-1]).T for j in range(j0, j1)])
        if src.kind == "bias":  # ours [H, Dh] = HF [H*Dh] reshaped
            (h0, h1), (e0, e1) = ours
            dh = per_shape[1]
            return self.read(src.name, [(h0 * dh, h1 * dh)]).reshape(h1 - h0, dh)[:, e0:e1]
        if src.kind == "cols":
            (e, d, (f0, f1)) = ours
            return self.read(src.name, [e, d, (src.col + f0, src.col + f1)])
        dh = per_shape[2] if src.kind == "qkv" else per_shape[1]
        if src.kind == "qkv":  # ours [D, H, Dh] = HF [H*Dh, D].T reshaped
            (d0, d1), (h0, h1), (e0, e1) = ours
            a = self.read(src.name, [(h0 * dh, h1 * dh), (d0, d1)]).T.reshape(d1 - d0, h1 - h0, dh)
            return a[:, :, e0:e1]
        if src.kind == "o":  # ours [H, Dh, D] = HF [D, H*Dh].T reshaped
            (h0, h1), (e0, e1), (d0, d1) = ours
            a = self.read(src.name, [(d0, d1), (h0 * dh, h1 * dh)]).T.reshape(h1 - h0, dh, d1 - d0)
            return a[:, e0:e1, :]
        raise ValueError(f"unknown layout {src.kind!r} of {src.name!r}")


def _leaf(reader: _Reader, src, shape: tuple[int, ...], sharding, np_dt) -> jax.Array:
    """One parameter as a global array: each distinct block this process's devices hold is read once, put on the
    device(s) that hold it and dropped before the next is read, so host memory holds one block at a time."""

    def read(ranges: list[tuple[int, int]]) -> np.ndarray:
        if isinstance(src, list):  # stacked layers: one HF tensor per layer
            (l0, l1), rest = ranges[0], ranges[1:]
            out = np.empty([b - a for a, b in ranges], np_dt)
            for j, i in enumerate(range(l0, l1)):
                out[j] = reader.block(src[i], rest, shape[1:])
            return out
        return np.ascontiguousarray(reader.block(src, ranges, shape), np_dt)

    by_block: dict[tuple, list] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        by_block.setdefault(tuple(_ranges(index, shape)), []).append(device)
    arrays = []
    for ranges, devices in by_block.items():
        block = read(list(ranges))
        arrays += [jax.device_put(block, d) for d in devices]
        jax.block_until_ready(arrays[-1])
        del block
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _walk(tree: dict, fn, path: tuple[str, ...] = ()) -> dict:
    return {k: _walk(v, fn, (*path, k)) if isinstance(v, dict) else fn((*path, k), v) for k, v in tree.items()}


def _get(tree: dict, path: tuple[str, ...]):
    for k in path:
        tree = tree[k]
    return tree


def load_hf_sharded(path: str | os.PathLike, cfg: ModelConfig, shardings: dict[str, Any], *,
                    stats: ReadStats | None = None) -> dict[str, Any]:
    """Our params for ``cfg`` (the planned architecture; storage dtype ``cfg.param_dtype``) from the HF directory
    ``path``, as global ``jax.Array`` s with ``shardings`` (a params tree of ``NamedSharding``). Every process of
    a multi-process run calls it and reads only its own devices' blocks (module docstring); ``stats`` counts the
    bytes this process read. Every tensor's presence and shape is checked before any is read."""
    path = Path(path)
    stats = stats if stats is not None else ReadStats()
    hf_cfg, ckpt_cfg = read_hf_config(path, cfg.param_dtype)
    want, found = param_shapes(cfg), param_shapes(ckpt_cfg)
    if want != found:
        raise CheckpointError(f"{path}: the checkpoint's shapes {found} differ from the run's model {want}")
    np_dt = np.dtype(to_dtype(cfg.param_dtype))
    srcs = sources(cfg, hf_cfg)
    with contextlib.ExitStack() as stack:
        tensors = _collect_tensors(path, stack)  # names, files, shapes and dtypes checked; no data read
        files = {fname: _Rectangles(path / fname) for fname in sorted({f for _, f, _ in tensors.values()})}
        for f in files.values():
            stack.callback(f.close)
        reader = _Reader(path, tensors, stats, files)
        _walk(srcs, lambda p, s: [reader.check(x) for x in (s if isinstance(s, list) else [s])])
        return _walk(srcs, lambda p, s: _leaf(reader, s, tuple(_get(want, p)), _get(shardings, p), np_dt))
