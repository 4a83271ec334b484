// microgpt_cuda.cu: the FP32 CUDA engine that trains the ANDREA GPT family.
//
// The one translation unit PyCUDA compiles (microgpt/kernels.py); the layers live in the headers beside
// it, as llm.c keeps llmc/*.cuh. Every operation has a forward and a backward kernel, k_<op>_fwd and
// k_<op>_bwd, all extern "C" so that they are found by name. These are the reference kernels: readable
// first, one thread per output element where that is the natural reading. Faster variants live beside
// them in *_fast.cuh and are tested against them.
//
// Conventions: row-major float32; activations are written, weight gradients are added into (+=) so
// that backward accumulates until the gradients are zeroed; B batch, T time, C = d_model, NH heads,
// d_k = C / NH, V vocabulary, N = B * T rows.
#include "embed.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "attention.cuh"
#include "pointwise.cuh"
#include "crossentropy.cuh"
#include "adamw.cuh"
// the fast variants, beside the reference kernels they are tested against
#include "matmul_fast.cuh"
#include "rows_fast.cuh"
