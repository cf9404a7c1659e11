"""The analyses behind tools/analysis/ (each tool runs the ``main`` of its module here):

    measure_conditioning  κ of the embedded tokens and of every attention layer on a config's val images
    plot_conditioning     κ over training from AttentionKappaHook's scalars
    measure_token_scale   the token scale ||X + C||_F / ||X||_F of each dose of the conditioning
    attention_kappa       κ per arm of a suite run, at the start, middle and end of training
    singular_attention    the share of numerically singular (κ > 2**24) windows per attention layer of a cell
    dose_response         AP against each method's strength, from a finished suite run
    confirmatory_answer   a pre-registered study's answer from its records, by its declared rule (--suite)
    repeatability         how far two runs of one cell differ
    training_dynamics     variants trained from the same initial weights, compared block by block
    get_flops             FLOPs with the token conditioner counted
    summarize_test        the COCO table of a tools/test.py run
    draw_architecture     the figure of where the conditioner sits
    neon_predictions      detectors' boxes on a NEON photograph beside its ground truth

Not imported by ``condtok_mm``.
"""
