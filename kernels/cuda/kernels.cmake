# The CUDA kernels, one .cu per kernel, each with a header declaring its launcher. Built by nvcc into
# shardlm_kernels_cuda and, translated to host C++, into the emulated shardlm_kernels_cuda_emu.
set(SHARDLM_CUDA_KERNELS
    device_info.cu
    # Model ops (activations fp32, weights fp32 or bf16).
    embedding.cu rmsnorm.cu rope.cu activation.cu elementwise.cu kv_cache_write.cu rope_kv_write.cu paged_attention.cu
    paged_attention_tiled.cu prefill_attention_mma.cu prefill_latent_attention_mma.cu mma_bf16_tile.cu run_positions.cu
    latent_attention.cu latent_rope_cache_write.cu decode_latent_attention_mma.cu attention_combine.cu
    head_matmul.cu split_columns.cu
    # Routing, expert permutation, expert-parallel row movement, fp8 dequantisation, sampling (and its
    # penalties), logprobs.
    moe_topk.cu expert_permute.cu fp8_dequant.cu sampling.cu logit_edits.cu gated_add.cu expert_rows.cu
    expert_exchange.cu wire_bf16.cu wire_fp8.cu
    # Linear layers on weights kept fp8 (a few rows: decode).
    rows_matmul.cu
    # Activations quantised to fp8 for the block-scaled fp8 GEMMs (W8A8: prefill on fp8 weights), and
    # the grouped W8A8 GEMM of the experts on fp8 tensor cores with its fragment layout probe; the
    # grouped bf16 GEMM on bf16 tensor cores (routed calls in CUDA graphs); both on Hopper's
    # warpgroup products too, with their one-product layout probe; the tile lists of all.
    fp8_act_quant.cu fp8_grouped_gemm_mma.cu mma_fp8_tile.cu bf16_grouped_gemm_mma.cu bf16_grouped_gemm_wgmma.cu
    fp8_grouped_gemm_wgmma.cu wgmma_tile.cu gemm_tiles.cu
    # Calibration: the largest magnitude of a buffer (a KV cache's fp8 scales).
    abs_max.cu)
