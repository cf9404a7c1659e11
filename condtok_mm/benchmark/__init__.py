"""The measurements behind tools/benchmark/ (each tool runs the ``main`` of its module here):

    overhead             training-step and inference time and peak memory, baseline vs conditioned detector
    overhead_report      overhead's tables (text and markdown) and plot
    conditioner_cost     TokenConditioner alone against its float64 floor, on the CPU or a CUDA device
    conditioner_cuda     conditioner_cost's rows on a CUDA device (torch and condtok_mm.conditioning only)
    backbone_share       the conditioner's share of a timm backbone's training step (torch and timm only)
    op_counts            the aten ops, host syncs and float64 FLOPs of one call
    byte_counts          the bytes one call moves, in passes over the tokens, and its peak extra memory
    window_conditioning  per-window against whole-image conditioning
    hook_overhead        AttentionKappaHook's recording against a training step
    eval_speed           FastCocoMetric against mmdet's CocoMetric
    onnx_latency         an exported conditioned backbone under onnxruntime on the CPU

Not imported by ``condtok_mm``; conditioner_cuda, op_counts and backbone_share import nothing of the OpenMMLab stack.
"""
