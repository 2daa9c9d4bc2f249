"""The training step without a GPU (`gpumem-top fit --no-gpu`): the program
runs with CUDA faked and every request the CUDA caching allocator would get
is recorded, in the order it would get it, as a memory snapshot
(`_dump_snapshot`'s format) that `gpumem-top fit` replays through its
allocator. The method and what it cannot see: docs/user/fit.md "Without a
GPU".

How CUDA is faked: a CUDA tensor is a meta tensor (a shape, a dtype and a
storage of its size, no data), so no compute happens and no memory is
taken; `torch.cuda` answers as one H200 would; a torch-function mode turns
`device="cuda"` into meta, presents meta tensors as `cuda:0` to the
program, applies CUDA autocast's cast policies (autocast has no meta
kernels) and picks SDPA's kernel as CUDA would; a torch-dispatch mode (below
autograd, so backward's ops are seen too) records each new storage as an
allocation and a weak reference tells when it dies. What real CUDA kernels
take from the allocator besides their outputs (cuBLAS's workspaces,
reductions' partial sums, flash attention's backward scratch) is added as
measured on an H200 (docs/user/fit.md)."""

import os
import sys
import time
import weakref

_HERE = os.path.abspath(__file__)
if _HERE.endswith((".pyc", ".pyo")):
    _HERE = _HERE[:-1]
# PyTorch's own machinery between the program and an op when a mode is on:
# the real run's stacks do not have these frames.
_MACHINERY = ("torch/_ops.py", "torch/_compile.py", "torch/_dynamo/eval_frame.py", "torch/utils/_python_dispatch.py",
              "torch/overrides.py")

# What the fake device is (an H200: what the calibration was measured on).
DEVICE_TOTAL = int(os.environ.get("GPUMEM_TOP_NOGPU_TOTAL", str(150_121_873_408)) or 0)
DEVICE_NAME = "NVIDIA H200"
SM_COUNT = 132
# cuBLAS's workspace on Hopper (32 MiB) and cuBLASLt's (1 MiB): taken at a
# handle's first GEMM and kept; backward runs on the autograd engine's
# thread, whose handle takes its own cuBLAS workspace.
CUBLAS_WORKSPACE = 32 << 20
CUBLASLT_WORKSPACE = 1 << 20

_ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "addr", "_addmm_activation"}

# CUDA autocast's policies (ATen's autocast_mode.h, CUDA lists).
_LOWER = {
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
    "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "__matmul__", "__rmatmul__",
}
_FP32 = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "nll_loss_nd", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
    "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist",
    "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
}
_FP32_OPT_DTYPE = {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                   "linalg_matrix_norm", "sum"}
_PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add"}


def _warn(msg):
    try:
        sys.stderr.write("gpumem-top fit --no-gpu: %s\n" % msg)
    except Exception:
        pass


class Recorder:
    """The allocator's requests as a trace: fake addresses, one per storage,
    never reused (the replay places every block itself)."""

    def __init__(self, torch, out, steps, max_events):
        self.torch = torch
        self.out = out
        self.steps = steps
        self.max_events = max_events
        self.events = []
        self.live = {}
        # Which live storage a fake address belongs to: a gradient summed
        # in place hands its block on to the sum.
        self.owner = {}
        self.paused = False
        self.next_addr = 1 << 40
        self.live_bytes = 0
        self.peak_bytes = 0
        self.steps_done = 0
        self.done = False
        self.pid = os.getpid()
        self.frames_cache = {}
        self.workspace_fwd = False
        self.workspace_bwd = False
        self.notes = {}
        self.t0 = time.time()

    # -- events --------------------------------------------------------------

    def _frames(self):
        """The Python stack, innermost first, as `stacks="python"` records
        it; none in backward (the autograd engine's thread has none)."""
        if self.torch._C._current_autograd_node() is not None:
            return []
        f = sys._getframe(2)
        key = []
        while f is not None:
            code = f.f_code
            fn = code.co_filename
            if fn != _HERE and not fn.endswith(_MACHINERY):
                key.append((code.co_filename, f.f_lineno, code.co_name))
            f = f.f_back
        key = tuple(key)
        fr = self.frames_cache.get(key)
        if fr is None:
            fr = [{"filename": a, "line": b, "name": c} for (a, b, c) in key]
            self.frames_cache[key] = fr
        return fr

    def _time(self):
        return int((time.time() - self.t0) * 1e6)

    def alloc(self, size, frames=None):
        addr = self.next_addr
        self.next_addr += (size + 511) // 512 * 512 + 512
        if frames is None:
            frames = self._frames()
        self.events.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                            "time_us": self._time(), "frames": frames})
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if len(self.events) > self.max_events:
            self.note("the recording reached %d events and stopped there" % self.max_events)
            self.finish()
        return addr

    def free(self, addr, size):
        if self.done:
            return
        t = self._time()
        self.events.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                            "time_us": t, "frames": []})
        self.events.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                            "time_us": t, "frames": []})
        self.live_bytes -= size

    def scratch(self, size):
        """Scratch space a kernel takes and frees at once."""
        if size > 0:
            a = self.alloc(size)
            self.free(a, size)

    def note(self, what):
        self.notes[what] = self.notes.get(what, 0) + 1

    # -- storages ------------------------------------------------------------

    def track(self, t, size=None):
        """A new storage of `t` is an allocation (of `size` bytes where the
        device's differs from meta's), freed when the storage dies."""
        if t.device.type != "meta" or self.paused:
            return
        s = t.untyped_storage()
        key = s._cdata
        if key in self.live:
            return
        n = s.nbytes() if size is None else size
        if n == 0:
            # CUDA's allocator makes no block for an empty tensor.
            self.live[key] = None
            weakref.finalize(s, self.live.pop, key, None)
            return
        addr = self.alloc(n)
        self.live[key] = addr
        self.owner[addr] = key
        weakref.finalize(s, self._dead, key, addr, n)

    def block_of(self, t):
        """The fake address and size of `t`'s storage, where it is live."""
        s = t.untyped_storage()
        addr = self.live.get(s._cdata)
        return (addr, s.nbytes()) if addr is not None else None

    def adopt(self, t, addr, n):
        """`t`'s storage takes over the block at `addr` (an in-place sum
        made out of place under the fake device)."""
        s = t.untyped_storage()
        key = s._cdata
        if key in self.live or s.nbytes() != n:
            self.track(t)
            return
        self.live[key] = addr
        self.owner[addr] = key
        weakref.finalize(s, self._dead, key, addr, n)

    def _dead(self, key, addr, n):
        self.live.pop(key, None)
        if self.owner.get(addr) == key:
            del self.owner[addr]
            self.free(addr, n)

    # -- the end -------------------------------------------------------------

    def on_step(self, *_):
        self.steps_done += 1
        if self.steps and self.steps_done >= self.steps and not self.done:
            self.finish()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def finish(self):
        if self.done or os.getpid() != self.pid:
            return
        self.done = True
        import pickle

        torch = self.torch
        snap = {
            "segments": [],
            "device_traces": [self.events],
            "torch_version": str(getattr(torch, "__version__", "")),
            "gpumem_top_nogpu": {
                "device": DEVICE_NAME,
                "device_total": DEVICE_TOTAL,
                "optimizer_steps": self.steps_done,
                "notes": sorted(self.notes.items()),
            },
        }
        tmp = "%s.%d.tmp" % (self.out, os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snap, f, protocol=4)
        os.rename(tmp, self.out)


def _is_cuda(d):
    if d is None:
        return False
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    t = getattr(d, "type", None)
    return t == "cuda"


def install(torch, out, steps, max_events=20_000_000):
    """Fakes CUDA in this process and records; returns the recorder."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    rec = Recorder(torch, out, steps, max_events)
    meta = torch.device("meta")
    cuda0 = torch.device("cuda", 0)
    Tensor = torch.Tensor
    float_types = (torch.float32,)
    reduced = (torch.float16, torch.bfloat16)
    getters = {
        Tensor.device.__get__: "device",
        Tensor.is_cuda.__get__: "is_cuda",
        Tensor.is_meta.__get__: "is_meta",
    }
    cache = {}
    # "math": the dropout probability while ATen's math attention runs
    # (None outside it); "softmax_outs": storages of its softmaxes' outputs.
    state = {"error": None, "math": None, "softmax_outs": set()}

    def is_meta(x):
        return isinstance(x, Tensor) and x.is_meta

    def to_dev(x):
        return meta if _is_cuda(x) else x

    def cast(x, dtype):
        if isinstance(x, Tensor):
            if x.is_meta and x.is_floating_point() and x.dtype != dtype and x.dtype != torch.float64:
                can_cache = (dtype in reduced and x.dtype == torch.float32 and x.requires_grad and x.is_leaf
                             and not x._is_view() and torch.is_autocast_cache_enabled())
                if can_cache:
                    k = id(x)
                    hit = cache.get(k)
                    if hit is not None and hit[0]() is x:
                        return hit[1]
                    y = x.to(dtype)
                    cache[k] = (weakref.ref(x), y)
                    return y
                return x.to(dtype)
            return x
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v, dtype) for v in x)
        return x

    def cast_all(args, kwargs, dtype):
        """Autocast's casts of an op's arguments, in the order CUDA's build
        makes them: its wrapper casts each argument in a C++ call whose
        arguments GCC evaluates last to first (the H200 traces show a
        convolution's weight cast before its input's). The order decides
        which block each cast gets, and in backward which cast's gradient
        comes first."""
        kv = list(kwargs.items())
        new_kv = [(k, cast(v, dtype)) for k, v in reversed(kv)][::-1]
        new_args = [cast(a, dtype) for a in reversed(args)][::-1]
        return tuple(new_args), dict(new_kv)

    def widest(args):
        """Autocast's promote policy: the widest floating type among them."""
        best = None
        for a in args:
            for v in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(v, Tensor) and v.is_meta and v.is_floating_point():
                    if best is None or (v.dtype == torch.float32 and best in reduced):
                        best = v.dtype
        return best

    def sdpa(args, kwargs):
        """SDPA as CUDA's dispatcher would run it on an H200: flash for
        half types without a mask, memory-efficient otherwise, the math
        path where neither applies."""
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args))
        a.update(kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        mask = a.get("attn_mask")
        p = float(a.get("dropout_p", 0.0) or 0.0)
        causal = bool(a.get("is_causal", False))
        scale = a.get("scale")
        gqa = bool(a.get("enable_gqa", False))
        if torch.is_autocast_enabled("cuda"):
            dt = torch.get_autocast_dtype("cuda")
            # Last argument first, as autocast's wrapper does.
            if mask is not None and mask.is_floating_point():
                mask = cast(mask, dt)
            v, k, q = cast(v, dt), cast(k, dt), cast(q, dt)
        d = q.shape[-1]
        be = torch.backends.cuda
        four = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
        if (four and mask is None and q.dtype in reduced and d % 8 == 0 and d <= 256
                and be.flash_sdp_enabled()):
            # Flash attention takes fewer key/value heads as they are.
            rec.note("attention: flash")
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, p, causal, False, scale=scale)[0]
        # A mask that learns (T5's position bias) takes the math path on
        # the H200, as its traces show.
        learned_mask = mask is not None and mask.requires_grad
        if (four and not (gqa and q.shape[1] != k.shape[1]) and d % (4 if q.dtype == torch.float32 else 8) == 0
                and not learned_mask and be.mem_efficient_sdp_enabled()):
            rec.note("attention: memory-efficient")
            if mask is not None:
                mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            need = q.requires_grad or k.requires_grad or v.requires_grad
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, need, p, causal, scale=scale)[0]
        rec.note("attention: math")
        # Under the mode ATen's math path runs as for a tensor subclass;
        # `Record` makes its steps take CUDA's blocks (math_step).
        state["math"] = p
        try:
            return torch.ops.aten._scaled_dot_product_attention_math(
                q, k, v, mask, p, causal, None, scale=scale, enable_gqa=gqa)[0]
        finally:
            state["math"] = None

    def cross_entropy(args, kwargs):
        names = ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing")
        a = dict(zip(names, args))
        a.update(kwargs)
        x = a["input"]
        if x.dtype in reduced and float(a.get("label_smoothing", 0.0) or 0.0) == 0.0 and x.shape != a["target"].shape:
            # ATen's cross_entropy_loss: log_softmax in the input's own
            # dtype, then nll_loss, whose fp32 policy copies it.
            dim = 0 if x.dim() == 1 else 1
            lsm = torch.log_softmax(x, dim, dtype=x.dtype)
            return torch._C._nn.nll_loss_nd(cast(lsm, torch.float32), a["target"], a.get("weight"),
                                            a.get("reduction", 1), a.get("ignore_index", -100))
        return None

    class Cuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            g = getters.get(func)
            if g is not None:
                x = args[0]
                if x.is_meta:
                    return cuda0 if g == "device" else (g == "is_cuda")
                return func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs["device"] = meta
            if args and any(_is_cuda(a) for a in args if isinstance(a, (str, torch.device))):
                args = tuple(to_dev(a) for a in args)
            if name == "cuda" and args and isinstance(args[0], Tensor):
                nb = kwargs.get("non_blocking", False)
                return args[0].to(meta, non_blocking=nb)
            if args and is_meta(args[0]):
                x = args[0]
                if name == "item":
                    return False if x.dtype == torch.bool else (0 if not x.is_floating_point() else 0.0)
                if name in ("cpu", "numpy", "tolist") or (name == "to" and any(
                        (isinstance(a, str) and a == "cpu") or (isinstance(a, torch.device) and a.type == "cpu")
                        for a in list(args[1:]) + [kwargs.get("device")])):
                    z = torch.zeros(x.shape, dtype=x.dtype)
                    return z.numpy() if name == "numpy" else (z.tolist() if name == "tolist" else z)
                if name == "__bool__":
                    rec.note("a CUDA tensor's value was asked for (False given)")
                    return False
                if name in ("__float__", "__int__", "__index__"):
                    return 0.0 if name == "__float__" else 0
                if name == "get_device":
                    return 0
            if name == "scaled_dot_product_attention":
                return sdpa(args, kwargs)
            if name == "dropout" and args and is_meta(args[0]):
                # CUDA's fused kernel (a bool mask); off CUDA, dropout is
                # composed of ops that keep a mask of the input's type.
                x = args[0]
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                train = args[2] if len(args) > 2 else kwargs.get("train", True)
                if train and 0 < p < 1 and x.numel() > 0:
                    return torch.native_dropout(x, p, train)[0]
            if torch.is_autocast_enabled("cuda"):
                dt = torch.get_autocast_dtype("cuda")
                if name == "cross_entropy_loss":
                    r = cross_entropy(args, kwargs)
                    if r is not None:
                        return r
                if name in _LOWER:
                    args, kwargs = cast_all(args, kwargs, dt)
                elif name in _FP32:
                    args, kwargs = cast_all(args, kwargs, torch.float32)
                elif name in _FP32_OPT_DTYPE and args and is_meta(args[0]) and args[0].dtype in reduced:
                    if kwargs.get("dtype") is None and not any(isinstance(a, torch.dtype) for a in args):
                        kwargs["dtype"] = torch.float32
                elif name in _PROMOTE:
                    w = widest(args)
                    if w is not None:
                        args, kwargs = cast_all(args, kwargs, w)
            return func(*args, **kwargs)

    add = torch.ops.aten.add.Tensor

    def dense(x):
        """Non-overlapping and dense: the strides, smallest first, step
        through the sizes with no gap."""
        want = 1
        for size, stride in sorted(zip(x.shape, x.stride()), key=lambda p: p[1]):
            if size == 1:
                continue
            if stride != want:
                return False
            want *= size
        return True
    sole = {"tensor": None, "storage": None}

    def owned(x):
        """Whether the autograd engine could sum into `x` in place: only
        the gradient buffer holds it and its storage (the counts as this
        process sees them inside the mode, calibrated below)."""
        if sole["tensor"] is None or not (x.is_contiguous() or dense(x)):
            return False
        return (x._use_count() <= sole["tensor"]
                and torch._C._storage_Use_Count(x.untyped_storage()._cdata) <= sole["storage"])

    def accumulation(args, kwargs):
        """A gradient sum of the autograd engine. With a dispatch mode on,
        PyTorch treats every tensor as a subclass and never sums gradients
        in place (`can_accumulate_inplace`); on CUDA it does when a buffer
        is the gradient's only owner. The block that sum reuses, or None."""
        if kwargs or len(args) != 2 or torch._C._current_autograd_node() is None:
            return None
        a, b = args
        if not (is_meta(a) and is_meta(b)) or a.shape != b.shape or a.dtype != b.dtype:
            return None
        if sole["tensor"] is None:
            sole["tensor"] = max(a._use_count(), b._use_count())
            sole["storage"] = max(torch._C._storage_Use_Count(a.untyped_storage()._cdata),
                                  torch._C._storage_Use_Count(b.untyped_storage()._cdata))
            return None
        # `old_var + var`: only the buffer's own gradient (the first) is
        # summed into (InputBuffer's accumulate).
        if owned(a):
            blk = rec.block_of(a)
            if blk is not None and blk[1] == a.numel() * a.element_size():
                return blk
        return None

    def math_step(name, args, out):
        """A step of ATen's math attention as CUDA takes its blocks, where
        the meta run differs (the T5 traces on the H200 show each):

        - the mask is added in place (`attn.add_(mask)`; out of place only
          for a tensor subclass, which every tensor is under the mode);
        - dropout is CUDA's fused kernel, its mask one byte an element
          (off CUDA `at::dropout` keeps a mask of the input's type);
        - `_safe_softmax` (CUDA's composite) takes, after its output, the
          `-inf` test of every score (bool), its rows' `all` (bool) and a
          scalar, freed before it returns; its backward takes a second
          block of the gradient's size beside `_softmax_backward_data`'s.

        True where the step's output was recorded here."""
        if name == "add" and state["math"] is not None and is_meta(args[0]) and isinstance(out, Tensor):
            blk = rec.block_of(args[0])
            if blk is not None and args[0].shape == out.shape and blk[1] == out.numel() * out.element_size():
                rec.adopt(out, blk[0], blk[1])
                return True
        elif name == "empty_like" and state["math"] and is_meta(out):
            rec.track(out, out.numel())
            return True
        elif name == "_safe_softmax" and is_meta(out):
            rec.track(out)
            x, dim = args[0], args[1] % max(args[0].dim(), 1)
            n = x.numel()
            rows = n // max(x.shape[dim], 1) if x.dim() else n
            held = [(rec.alloc(m), m) for m in (n, rows, out.element_size()) if m > 0]
            for a, m in reversed(held):
                rec.free(a, m)
            key = out.untyped_storage()._cdata
            state["softmax_outs"].add(key)
            weakref.finalize(out.untyped_storage(), state["softmax_outs"].discard, key)
            return True
        elif (name == "_softmax_backward_data" and is_meta(out) and is_meta(args[1])
              and args[1].untyped_storage()._cdata in state["softmax_outs"]):
            n = out.numel() * out.element_size()
            a = rec.alloc(n)
            rec.track(out)
            rec.free(a, n)
            return True
        return False

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            into = accumulation(args, kwargs) if func is add else None
            try:
                out = func(*args, **(kwargs or {}))
            except Exception as e:
                if state["error"] is None:
                    state["error"] = (str(func), e)
                raise
            name = func._overloadpacket.__name__
            if into is not None:
                rec.adopt(out, into[0], into[1])
                return out
            if math_step(name, args, out):
                return out
            if name == "_scaled_dot_product_flash_attention":
                # As the H200 traces show it, with dropout or without: the
                # RNG's seed and offset (8 bytes each on the device), then
                # the output, its log-sum-exp, and 256 bytes of scratch.
                rec.track(out[6], 8)
                rec.track(out[7], 8)
                _walk(out[:2], rec.track)
                rec.scratch(256)
            elif name == "_scaled_dot_product_efficient_attention":
                # The output and its log-sum-exp; with dropout, as flash
                # takes them, the RNG's seed and offset first and 256
                # bytes of scratch after (T5's traces on the H200).
                dropout = float(args[5] if len(args) > 5 else (kwargs or {}).get("dropout_p", 0.0)) > 0
                if dropout:
                    rec.track(out[2], 8)
                    rec.track(out[3], 8)
                _walk(out[:2], rec.track)
                if dropout:
                    rec.scratch(256)
            elif name == "native_dropout":
                # CUDA's fused dropout allocates its mask first.
                _walk(out[::-1], rec.track)
            elif name in ("convolution", "convolution_backward") and is_meta(args[0]):
                if name == "convolution":
                    x, w, st, pad, dil, tr, _, groups = args[:2] + args[3:9]
                else:
                    x, w, _, st, pad, dil, tr, _, groups = args[1:10]
                ws = _cudnn(x, w, st, pad, dil, tr, groups)
                if ws is None:
                    rec.note("convolutions without a measured cuDNN workspace")
                    ws = [0, 0, 0]
                if name == "convolution":
                    rec.track(out)
                    rec.scratch(ws[0])
                else:
                    # Each workspace right after the gradient it makes.
                    for t, w in zip(out, (ws[1], ws[2], 0)):
                        if t is not None:
                            rec.track(t)
                        rec.scratch(w)
                return out
            else:
                _walk(out, rec.track)
            if name in _GEMMS:
                bwd = torch._C._current_autograd_node() is not None
                if not bwd and not rec.workspace_fwd:
                    rec.workspace_fwd = True
                    rec.alloc(CUBLAS_WORKSPACE)
                    rec.alloc(CUBLASLT_WORKSPACE)
                elif bwd and not rec.workspace_bwd:
                    rec.workspace_bwd = True
                    rec.alloc(CUBLAS_WORKSPACE)
            elif name in ("sum", "mean") and len(args) >= 2 and is_meta(args[0]):
                _reduction(rec, args, out)
            elif name == "_scaled_dot_product_flash_attention_backward":
                _flash_backward_scratch(rec, args)
            elif name == "_scaled_dot_product_efficient_attention_backward":
                _efficient_backward_scratch(rec, args)
            return out

    _fake_cuda_api(torch, rec)
    _undo_function_checks(torch)
    _keep_ties(torch)
    # Both modes for the rest of the program (never exited).
    Record().__enter__()
    # What "only the buffer holds it" reads as here: two fresh gradients
    # summed into a leaf's buffer (CUDA sums them in place), unrecorded.
    rec.paused = True
    x = torch.empty(64, device="meta", requires_grad=True)
    ((x * 2.0) + (x * 3.0)).sum().backward()
    del x
    rec.paused = False
    Cuda().__enter__()

    clear = torch.clear_autocast_cache

    def clear_autocast_cache():
        cache.clear()
        clear()

    torch.clear_autocast_cache = clear_autocast_cache

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(rec.on_step)
    rec.state = state
    return rec


def _walk(out, fn):
    import torch

    if isinstance(out, torch.Tensor):
        fn(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _walk(o, fn)


def _reduction(rec, args, out):
    """CUDA's reduction kernel (ATen's Reduce.cuh, `setReduceConfig`) over
    leading dimensions into a contiguous tail (a bias gradient: rows summed
    into `outs` columns): when each thread would sum 256 or more values and
    the grid is small, the input is split across blocks, which write fp32
    partial sums to a global buffer and count themselves in semaphores,
    both taken from the allocator and freed when the kernel returns. The
    configuration below is ATen's on an H200 (132 SMs, 2,048 threads each);
    it gives the sizes the H200 traces show (6,291,456 and 24 bytes for a
    768-wide bias over 1,024 rows; 23,440,896 and 1,908 for 30,522 wide
    over 2,048; none over 1,024)."""
    import torch

    x = args[0]
    if not isinstance(out, torch.Tensor) or x.dtype == torch.float64 or x.is_complex():
        return
    dims = args[1] if len(args) > 1 else None
    if dims is None or x.dim() < 2 or not x.is_contiguous():
        return
    dims = sorted(d % x.dim() for d in (dims if isinstance(dims, (list, tuple)) else [dims]))
    if dims != list(range(len(dims))) or not dims:
        return
    outs = out.numel()
    n = x.numel()
    if outs == 0 or n == 0 or outs == n:
        return
    rows = n // outs
    vec = 4 if outs % 4 == 0 else (2 if outs % 2 == 0 else 1)
    mnt = 512 // vec

    def last_pow2(v):
        return 1 << (v.bit_length() - 1)

    d0 = last_pow2(outs) if outs < mnt else mnt
    d1 = last_pow2(rows) if rows < mnt else mnt
    bw = min(d0, 32)
    bh = min(d1, mnt // bw)
    bw = min(d0, mnt // bh)
    threads = bw * bh
    step_output = bw
    vpt = rows
    split = vpt >= bh * 16 or vpt >= 256
    if split:
        vpt = -(-rows // bh)
    else:
        step_output *= bh
    grid_x = -(-(outs // vec) // step_output)
    target = SM_COUNT * (2048 // threads)
    if not (split and vpt >= 256 and grid_x <= target):
        return
    ctas = max(min(-(-target // grid_x), -(-vpt // 16)), -(-vpt // 256))
    if ctas <= 1:
        return
    size = 4 * outs * ctas * bw * vec
    a1 = rec.alloc(size)
    a2 = rec.alloc(4 * grid_x)
    rec.free(a2, 4 * grid_x)
    rec.free(a1, size)


def _flash_backward_scratch(rec, args):
    """Flash attention's backward, as the H200 traces show it: after the
    three gradients one workspace, freed when it returns, of dq's fp32
    accumulator ([B, Lq, H, D]), softmax's row sums ([B, H, Lq], fp32),
    with fewer key/value heads (GQA) the key and value gradients for every
    head (then summed into each group's), and 256 bytes."""
    q, k = args[1], args[2]
    b, h, lq, d = q.shape
    size = b * lq * h * d * 4 + b * h * lq * 4 + 256
    if k.shape[1] != h:
        size += 2 * b * k.shape[2] * h * d * k.element_size()
    rec.scratch(size)


def _keep_ties(torch):
    """`module.to("cuda")` keeps a weight two modules share (a tied LM
    head) one tensor, as CUDA's in-place `param.data = ...` does; to meta a
    new Parameter is made per module, which would double it. Each tensor
    is converted once, and each module given that one Parameter."""
    import threading

    Module = torch.nn.Module
    orig = Module._apply
    tls = threading.local()

    def _apply(self, fn, recurse=True):
        if getattr(tls, "busy", False):
            return orig(self, fn, recurse)
        tls.busy = True
        try:
            before = [(m, n, p) for m in self.modules() for n, p in m._parameters.items() if p is not None]
            done = {}

            def once(t):
                k = id(t)
                if k not in done:
                    done[k] = (t, fn(t))
                return done[k][1]

            out = orig(self, once, recurse)
            first = {}
            for m, n, p in before:
                new = m._parameters.get(n)
                if new is None:
                    continue
                k = id(p)
                if k in first and new is not first[k]:
                    m._parameters[n] = first[k]
                else:
                    first.setdefault(k, new)
            return out
        finally:
            tls.busy = False

    Module._apply = _apply


_CUDNN = {}



_CUDNN = {}


def _cudnn(x, w, stride, padding, dilation, transposed, groups):
    """cuDNN's workspaces (forward, backward-data, backward-filter) for a
    convolution measured on an H200 (cudnn_h200.json, written beside this
    file: ResNet-50's convolutions at batches 1-512), at this batch: between
    two measured batches interpolated, past the largest in proportion to
    the batch. None where the shape was not measured."""
    if "table" not in _CUDNN:
        try:
            import json

            with open(os.path.join(os.path.dirname(_HERE), "cudnn_h200.json")) as f:
                _CUDNN["table"] = json.load(f).get("convs", {})
        except Exception:
            _CUDNN["table"] = {}
    if transposed or groups != 1 or x.dim() != 4 or any(d != 1 for d in dilation):
        return None
    if x.shape[2] != x.shape[3] or w.shape[2] != w.shape[3] or len(set(stride)) != 1 or len(set(padding)) != 1:
        return None
    key = "%d,%d,%d,%d,%d,%d" % (x.shape[1], w.shape[0], w.shape[2], stride[0], padding[0], x.shape[2])
    import torch

    rows = _CUDNN["table"].get(key, {}).get("bf16" if x.dtype == torch.bfloat16 else "fp32")
    if not rows:
        return None
    b = x.shape[0]
    hi = next((i for i, r in enumerate(rows) if r[0] >= b), None)
    if hi is None:
        last = rows[-1]
        return [v * b // max(last[0], 1) for v in last[1:]]
    if hi == 0 or rows[hi][0] == b:
        return list(rows[hi][1:])
    lo, up = rows[hi - 1], rows[hi]
    f = (b - lo[0]) / (up[0] - lo[0])
    return [(a if f < 0.5 else c) if (a == 0 or c == 0) else int(round(a + (c - a) * f)) for a, c in zip(lo[1:], up[1:])]


def _efficient_backward_scratch(rec, args):
    """The memory-efficient attention's backward (fp32), as the H200
    traces show it after the gradients: the product of the output and its
    gradient ([B, L, H, D], fp32) and its sum over D twice ([B, H, L]); the
    product and one sum freed, then a workspace of [B, L, H, D] fp32 plus
    32 floats per batch and head; the other sum and the workspace freed
    when it returns."""
    import torch

    q = args[1]
    b, h, lq, d = q.shape
    prod = b * h * lq * d * 4
    delta = b * h * lq * 4
    if q.dtype != torch.float32:
        # Half types: the kernel computes the sums itself, in one
        # workspace of the fp32 accumulator, the sums and 256 bytes
        # (8,519,936 bytes for [16, 8, 256, 64] bf16 in T5's H200 trace).
        rec.scratch(prod + delta + 256)
        return
    ws = prod + b * h * 32 * 4
    a1 = rec.alloc(prod)
    a2 = rec.alloc(delta)
    a3 = rec.alloc(delta)
    rec.free(a2, delta)
    rec.free(a1, prod)
    a4 = rec.alloc(ws)
    rec.free(a3, delta)
    rec.free(a4, ws)


def _undo_function_checks(torch):
    """torch.nn.functional's Python functions hand themselves whole to the
    torch-function mode; with the check answering "no" for plain tensors
    their bodies run, so the mode sees the ATen-level calls inside them
    (cross_entropy's loss, layer_norm, the attention) as autocast does."""
    import torch.nn.functional as F
    import torch.functional as TF

    Tensor = torch.Tensor

    def plain(*xs):
        for x in xs:
            if isinstance(x, (list, tuple)):
                if not plain(*x):
                    return False
            elif x is not None and type(x) is not Tensor and type(x) is not torch.nn.Parameter and hasattr(
                    x, "__torch_function__"):
                return False
        return True

    def unary(x):
        return not plain(x)

    def variadic(*xs):
        return not plain(*xs)

    def anyof(xs):
        return not plain(*xs)

    for mod in (F, TF):
        if hasattr(mod, "has_torch_function_unary"):
            mod.has_torch_function_unary = unary
        if hasattr(mod, "has_torch_function_variadic"):
            mod.has_torch_function_variadic = variadic
        if hasattr(mod, "has_torch_function"):
            mod.has_torch_function = anyof


class _Props:
    def __init__(self, total):
        self.name = DEVICE_NAME
        self.total_memory = total
        self.major, self.minor = 9, 0
        self.multi_processor_count = SM_COUNT
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = 60 << 20
        self.gcnArchName = ""
        self.uuid = "GPU-00000000-0000-0000-0000-000000000000"

    def __repr__(self):
        return "_CudaDeviceProperties(name='%s', major=9, minor=0, total_memory=%dMB, multi_processor_count=%d)" % (
            self.name, self.total_memory >> 20, self.multi_processor_count)


class _Stream:
    def __init__(self, *a, **k):
        self.device = None
        self.cuda_stream = 0

    def synchronize(self):
        pass

    def wait_stream(self, *_):
        pass

    def wait_event(self, *_):
        pass

    def record_event(self, event=None):
        return event or _Event()

    def query(self):
        return True

    def is_capturing(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Event:
    def __init__(self, *a, **k):
        pass

    def record(self, *a):
        pass

    def synchronize(self):
        pass

    def wait(self, *a):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class _Nothing:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __call__(self, f=None, *a, **k):
        return f


def _own(f, name):
    def g(*a, **k):
        return f(*a, **k)

    g.__name__ = g.__qualname__ = name
    return g


def _fake_cuda_api(torch, rec):
    """torch.cuda answers as one H200 with this recording's figures."""
    c = torch.cuda
    props = _Props(DEVICE_TOTAL)
    nothing = lambda *a, **k: None  # noqa: E731
    table = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": nothing,
        "synchronize": nothing,
        "init": nothing,
        "is_initialized": lambda: True,
        "_lazy_init": nothing,
        "get_device_name": lambda *a, **k: DEVICE_NAME,
        "get_device_properties": lambda *a, **k: props,
        "get_device_capability": lambda *a, **k: (9, 0),
        "get_arch_list": lambda: ["sm_90"],
        "is_bf16_supported": lambda *a, **k: True,
        "mem_get_info": lambda *a, **k: (DEVICE_TOTAL - rec.live_bytes, DEVICE_TOTAL),
        "memory_allocated": lambda *a, **k: rec.live_bytes,
        "max_memory_allocated": lambda *a, **k: rec.peak_bytes,
        "memory_reserved": lambda *a, **k: rec.live_bytes,
        "max_memory_reserved": lambda *a, **k: rec.peak_bytes,
        "reset_peak_memory_stats": nothing,
        "reset_max_memory_allocated": nothing,
        "reset_accumulated_memory_stats": nothing,
        # The requests' own bytes (no rounding, no cache): what the replay
        # gives is the allocator's figure.
        "memory_stats": lambda *a, **k: {
            "allocated_bytes.all.current": rec.live_bytes, "allocated_bytes.all.peak": rec.peak_bytes,
            "reserved_bytes.all.current": rec.live_bytes, "reserved_bytes.all.peak": rec.peak_bytes,
            "active_bytes.all.current": rec.live_bytes, "active_bytes.all.peak": rec.peak_bytes,
            "num_alloc_retries": 0, "num_ooms": 0},
        "memory_summary": lambda *a, **k: "",
        "empty_cache": lambda: rec.note("torch.cuda.empty_cache() was called (not replayed)"),
        "manual_seed": nothing,
        "manual_seed_all": nothing,
        "seed": nothing,
        "seed_all": nothing,
        "set_per_process_memory_fraction": nothing,
        "Stream": _Stream,
        "Event": _Event,
        "stream": lambda *a, **k: _Nothing(),
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
        "device": _Nothing,
        "is_current_stream_capturing": lambda: False,
        "nvtx": type("nvtx", (), {"range_push": staticmethod(nothing), "range_pop": staticmethod(nothing),
                                 "range": _Nothing, "mark": staticmethod(nothing)}),
    }
    for k, v in table.items():
        if callable(v) and getattr(v, "__name__", "") == "<lambda>":
            # A function of its own per name: torch._dynamo keeps rules per
            # function object, and one object under two names is refused.
            v = _own(v, k)
        setattr(c, k, v)
    c.memory._record_memory_history = nothing
    c.memory._dump_snapshot = nothing
    for k in ("empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
              "reset_peak_memory_stats", "mem_get_info", "set_per_process_memory_fraction"):
        if hasattr(c.memory, k):
            setattr(c.memory, k, getattr(c, k))
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        for k, v in {
            "is_available": lambda *a, **k: True,
            "device_count": lambda *a, **k: 1,
            "current_accelerator": lambda *a, **k: torch.device("cuda"),
            "current_device_index": lambda *a, **k: 0,
            "current_device_idx": lambda *a, **k: 0,
            "set_device_index": nothing,
            "set_device_idx": nothing,
            "current_stream": lambda *a, **k: _Stream(),
            "set_stream": nothing,
            "synchronize": nothing,
        }.items():
            if hasattr(acc, k):
                setattr(acc, k, _own(v, k))
        mem = getattr(acc, "memory", None)
        for k in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                  "reset_peak_memory_stats", "empty_cache"):
            if mem is not None and hasattr(mem, k):
                setattr(mem, k, getattr(c, k))
    # Pinned host memory needs a driver; without one a pinned tensor is a
    # plain one (nothing of the device's).
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.Tensor.is_pinned = lambda self, *a, **k: False
    try:
        torch.backends.cudnn.is_available = lambda: True
    except Exception:
        pass
