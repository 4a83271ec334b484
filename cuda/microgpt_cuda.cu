// microgpt_cuda.cu: the FP32 CUDA engine that trains the ANDREA GPT family, the one translation unit PyCUDA
// compiles (microgpt/kernels/runtime.py). Each header it includes has a launcher module of the same name in
// microgpt/kernels/; every operation has extern "C" kernels k_<op>_fwd and k_<op>_bwd, found by name.
// Conventions: row-major float32; activations are written, weight gradients are added into (+=) until zeroed;
// B batch, T time, C = d_model, NH heads, d_k = C / NH, V vocabulary, N = B * T rows. docs/kernels/ describes them.

// the reference kernels
#include "embed.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "attention.cuh"
#include "pointwise.cuh"
#include "crossentropy.cuh"
#include "adamw.cuh"
#include "decode.cuh"
#include "sampling.cuh"
// the fast variants
#include "colsum.cuh"
#include "matmul_fast.cuh"
#include "matvec.cuh"
#include "rows_fast.cuh"
#include "layernorm_fast.cuh"
#include "pointwise_fast.cuh"
#include "heads_fast.cuh"
#include "embed_fast.cuh"
// the tensor-core products (sm_80 and later)
#include "matmul_tc.cuh"
#include "tf32_split.cuh"
#include "flash_attention.cuh"
#include "matmul_attention_tc.cuh"
#include "matmul_gelu_tc.cuh"
