"""The paper's fitted values (RECIPE.md section 1, Table 1), shared by tests and benchmarks as ground truth."""

# (run, C_mid in GPU-hours, B, A)
TABLE1 = [
    ("ScaleRL", 2542, 1.92, 0.610),
    ("ScaleRL 32k gen", 11272, 1.89, 0.645),
    ("8 gen/prompt", 2542, 2.44, 0.585),
    ("24 gen/prompt", 3054, 2.22, 0.590),
    ("32 gen/prompt", 2936, 2.07, 0.595),
    ("Scout MoE", 4242, 1.65, 0.710),
    ("batch 512", 2818, 1.77, 0.605),
    ("batch 2048", 10909, 1.70, 0.645),
    ("math+code math", 2896, 2.05, 0.595),
    ("math+code code", 1675, 1.09, 0.615),
]
