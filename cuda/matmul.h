// Host helpers shared by the two CUDA matmul entry files (matmul.cu, matmul_mma.cu).
#pragma once

#include "cuda/cuda_context.h"
#include "dispatch/kernel_params.h"

namespace kcap {
namespace cuda {

inline KcapMatmulParams matmul_params(const Stage& stage, const KernelCall& call) {
    return kcap::matmul_params(stage, call.n_tokens);
}

}  // namespace cuda
}  // namespace kcap
