"""The launch layer: cuda/microgpt_cuda.cu compiled through PyCUDA, one checked launcher per kernel.

    import pycuda.gpuarray as ga
    from microgpt import kernels as K
    x = ga.to_gpu(np.random.randn(8, 1024, 768).astype(np.float32))
    out = ga.empty_like(x); mean = ga.empty((8, 1024), np.float32); rstd = ga.empty_like(mean)
    K.layernorm_fwd(out, mean, rstd, x, w, b)

The package mirrors cuda/: one module per header, holding that header's launchers (embed, layernorm,
matmul, attention, pointwise, crossentropy, adamw; decode for sampling with a key-value cache, sampling for
choosing the next token by microgpt.sampling's rule; colsum,
matmul_fast, rows_fast, layernorm_fast, pointwise_fast, heads_fast and embed_fast for the fast variant;
matmul_tc for the tc variant's tensor-core products, tf32_split for the split passes that feed them,
flash_attention for its fused attention, matmul_attention_tc for the product before its backward, fused with its
delta, matmul_gelu_tc for mlp.proj's dX product fused with the GELU backward after it).
Beside them: products (every matrix product described once, a Gemm, and planned and launched by one function, gemm(),
for every variant), source (what nvcc compiles, and the argument formats read from it), runtime (compile once,
the primary context, launch, record and replay, KernelError), graph (a recorded plan as one CUDA graph: a
model's passes run as Pass) and checks (the argument checks). Which launcher each op runs in each variant is
microgpt.ops's table.

Every launcher takes its arguments in the kernel's order (outputs first), checks each one and raises
TypeError/ValueError naming the argument before anything is launched. Without `stream` a call is
synchronous; with a stream it is queued on it; with a runtime.Plan it is recorded, its kernel chosen for the
plan's device (runtime.device_of: a GPU that kernels.virtual describes, or this process's).
"""
import importlib

from .adamw import NORM_GRID, adamw, global_norm
from .attention import (attn_scores_bwd, attn_scores_fwd, attn_values_bwd, attn_values_fwd, causal_mask_bwd,
                        causal_mask_fwd, causal_scores_bwd, causal_scores_fwd, fused_attention_bwd, fused_attention_fwd,
                        matmul_attention_bwd, merge_heads_bwd, merge_heads_fwd, softmax_bwd, softmax_fwd,
                        split_heads_bwd, split_heads_fwd)
from .checks import check_ids, opt_ptr, ptr, shape_of
from .colsum import colsum
from .crossentropy import crossentropy_bwd, crossentropy_fwd
from .decode import attention_decode, embed_decode, kv_store
from .embed import embed_bwd, embed_fwd, token_order
from .embed_fast import embed_bwd_fast
from .graph import Graph, GraphUnavailable, Pass
from .flash_attention import fused_attention_bwd_tc, fused_attention_fwd_tc
from .flash_attention import supported as flash_attention_supported
from .heads_fast import merge_heads_bwd_fast, merge_heads_fwd_fast, split_heads_bwd_fast, split_heads_fwd_fast
from .runtime import (BLOCK, SYNC_EVERY_LAUNCH, KernelError, Launch, Plan, blocks, device_summary, engine, launch,
                     memory_free, NoDevice, release_at_exit, replay, synchronize)
from .layernorm import layernorm_bwd, layernorm_fwd, matmul_layernorm_bwd, residual_layernorm_fwd
from .layernorm_fast import (layernorm_bwd_fast, layernorm_fwd_fast, matmul_layernorm_bwd_fast,
                             matmul_layernorm_bwd_tc, residual_layernorm_fwd_fast)
from .matmul import matmul_bwd, matmul_fwd
from .matmul_attention_tc import matmul_attention_bwd_tc
from .matmul_gelu_tc import matmul_gelu_bwd_tc
from .products import (Gemm, MatrixProducts, attn_values_bwd_fast, attn_values_bwd_tc, attn_values_fwd_fast,
                   attn_values_fwd_tc, causal_scores_bwd_fast, causal_scores_bwd_tc, causal_scores_fwd_fast,
                   causal_scores_fwd_tc, gemm, gemm_tc, matmul_bwd_fast, matmul_bwd_tc, matmul_fwd_fast, matmul_fwd_tc,
                   sgemm, sgemm_tc)
from .matmul_fast import GEMM_TILE, Causal
from .matmul_tc import tensor_cores, warpgroup_mma
from .pointwise import gelu_bwd, gelu_fwd, matmul_gelu_bwd, residual_bwd, residual_fwd
from .pointwise_fast import gelu_bwd_fast, gelu_fwd_fast, matmul_gelu_bwd_fast
from .rows_fast import (crossentropy_bwd_fast, crossentropy_fwd_fast, embed_fwd_fast, softmax_bwd_fast,
                        softmax_fwd_fast)
from .sampling import sample
from .tf32_split import SplitArena, SplitOperands, split_floats, weight_splits
from .source import (NVCC_OPTIONS, TRANSLATION_UNIT, cuda_source_dir, full_source, int_constants, kernel_headers,
                     kernel_names, kernel_signatures, preprocessed)
from ..reference import MASK_VALUE

# the names these had before the enum
CAUSAL_OUT_LOWER, CAUSAL_A_LOWER, CAUSAL_A_UPPER = Causal.OUT_LOWER, Causal.A_LOWER, Causal.A_UPPER

# the names the variants' switch had here before the op table (microgpt.ops), which imports this package: looked
# up there when first asked for, so that kernels.select(variant) and kernels.VARIANTS still work
_OP_TABLE_NAMES = ("DEFAULT_VARIANT", "OPS", "VARIANTS", "Kernels", "Variant", "launcher", "resolve", "select")


def __getattr__(name):
    if name in _OP_TABLE_NAMES:
        return getattr(importlib.import_module("microgpt.ops"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
