// Host helpers shared by the two CUDA matmul entry files (matmul.cu, matmul_mma.cu).
#pragma once

#include "cuda/cuda_context.h"
#include "kernels/params.h"

namespace kcap {
namespace cuda {

inline KcapMatmulParams matmul_params(const Stage& stage, const KernelCall& call) {
    KcapMatmulParams p;
    p.k = int(stage.k);
    p.n = int(stage.n);
    p.m = call.n_tokens;
    p.row_bytes = unsigned(row_bytes(stage.operands[0]->format, stage.k));
    p.has_bias = stage.operands.size() > 1 && stage.operands[1] != nullptr;
    return p;
}

}  // namespace cuda
}  // namespace kcap
