"""RolloutEngine(compile=True): the torch.compile'd steps must decode exactly as the eager engine does.

Plain and speculative (chain and tree) decoding, greedy and seeded sampling, rows joining and leaving, weights
loaded in place between generate calls, and large weights that keep the CPU layouts through the custom op.
Compiling costs seconds per kind of step, so one compiled engine serves most tests.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import assert_same_outputs, build_tiny_model
from tests.engine.drafters import HFModelDrafter
from verl_tlt.engine import RolloutEngine, SamplingParams
from verl_tlt.engine.compiled_forward import STEP_KINDS, CompiledForward
from verl_tlt.modeling.cpu_linear import PACKED_MIN_WEIGHT, CpuLayoutLinear
from verl_tlt.modeling.linear_kernels import NO_PACKED_ENV, packed_kernel_available

# Inductor compiles each kind of step for seconds (a minute and more on one slow core, with an empty cache): the full
# tier runs these, the quick edit-loop tier does not.
pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21], [30, 31, 32]]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=5)


@pytest.fixture(scope="module")
def engines(varied_qwen2):
    path, hf_model = varied_qwen2
    # Noisy drafts are sometimes rejected: every verify outcome occurs. One drafter each, equally seeded, so that
    # both engines see the same drafts.
    eager = RolloutEngine.from_pretrained(str(path), max_num_seqs=3, drafter=HFModelDrafter(hf_model, noise=1.0))
    compiled = RolloutEngine.from_pretrained(
        str(path), max_num_seqs=3, drafter=HFModelDrafter(hf_model, noise=1.0), compile=True
    )
    return eager, compiled


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("strategy", [None, "4_1_4", "3_3_8"], ids=["plain", "chain", "tree"])
def test_compiled_engine_decodes_like_the_eager_engine(engines, params, strategy):
    eager, compiled = engines
    # max_num_seqs=3 with 5 prompts: batches of 3, 2 and 1 rows, requests joining and leaving mid-run.
    outputs = compiled.generate(PROMPTS, params, strategy=strategy)
    assert_same_outputs(outputs, eager.generate(PROMPTS, params, strategy=strategy))
    if strategy is not None and params.temperature == 0:  # greedy speculation: the tokens of plain decoding
        assert_same_outputs(outputs, eager.generate(PROMPTS, params))


def test_weights_loaded_in_place_are_used_by_the_compiled_steps(engines):
    eager, compiled = engines
    before = compiled.generate(PROMPTS[:2], GREEDY)
    generator = torch.Generator().manual_seed(0)
    original = {name: tensor.clone() for name, tensor in compiled.model.hf_weight_views().items()}
    updated = {name: t + 0.3 * torch.randn(t.shape, generator=generator) for name, t in original.items()}
    try:
        for engine in engines:
            engine.load_weights(updated.items())
        after = compiled.generate(PROMPTS[:2], GREEDY)
        assert [o.token_ids for o in after] != [o.token_ids for o in before]
        assert_same_outputs(after, eager.generate(PROMPTS[:2], GREEDY))
    finally:
        for engine in engines:
            engine.load_weights(original.items())


@pytest.mark.parametrize("packed", ["host", "switched_off"])
def test_large_weights_keep_the_cpu_layouts_inside_compiled_steps(tmp_path, monkeypatch, packed):
    if packed == "switched_off":
        monkeypatch.setenv(NO_PACKED_ENV, "1")  # what an AVX2-only host without the packed kernel does, on any host
    elif not packed_kernel_available(torch.float32):
        pytest.skip("this host's oneDNN refuses the packed linear in float32 (see the switched_off case)")
    intermediate = PACKED_MIN_WEIGHT // 64  # hidden 64: the MLP's products are just large enough for the packed kernel
    build_tiny_model("qwen2", tmp_path, weight_std=0.05, intermediate_size=intermediate)
    eager = RolloutEngine.from_pretrained(str(tmp_path), max_num_seqs=2)
    compiled = RolloutEngine.from_pretrained(str(tmp_path), max_num_seqs=2, compile=True)
    shapes = []  # (in, out) of every product served by the layouts
    layout_forward = CpuLayoutLinear._layout_forward

    def recording(self, x):
        shapes.append((self.in_features, self.out_features))
        return layout_forward(self, x)

    prompts = [[5, 6, 7], [8, 9]]
    reference = eager.generate(prompts, GREEDY)
    monkeypatch.setattr(CpuLayoutLinear, "_layout_forward", recording)
    assert_same_outputs(compiled.generate(prompts, GREEDY), reference)
    down, gate_up, lm_head = (intermediate, 64), (64, 2 * intermediate), (64, 97)
    # The LM head runs outside the compiled body, through the layouts, at every step (1 prefill + 19 decode steps).
    assert shapes.count(lm_head) == GREEDY.max_tokens
    if packed == "host":
        # The MLP's products live inside the compiled body: they reach the layouts through the custom op, at every
        # step (2 layers); the small attention products are left to inductor.
        assert shapes.count(down) == shapes.count(gate_up) == 2 * GREEDY.max_tokens
        assert set(shapes) == {down, gate_up, lm_head}
    else:  # no packed kernel: inductor's product serves the large weights too, inside the compiled body
        assert set(shapes) == {lm_head}


def test_each_engine_compiles_into_code_objects_of_its_own(varied_qwen2):
    # dynamo's recompile budget is per code object: shared ones ran out when one process built four compiled engines.
    first, second = (CompiledForward(RolloutEngine.from_pretrained(str(varied_qwen2[0])).model) for _ in range(2))
    codes = [fn._torchdynamo_orig_callable.__code__ for forward in (first, second) for fn in forward._compiled.values()]
    assert len(set(codes)) == len(codes) == 2 * len(STEP_KINDS)


def test_a_copied_model_reaches_its_own_weights_through_the_custom_op(tmp_path):
    import copy

    intermediate = PACKED_MIN_WEIGHT // 64
    build_tiny_model("qwen2", tmp_path, weight_std=0.05, intermediate_size=intermediate)
    original = RolloutEngine.from_pretrained(str(tmp_path), max_num_seqs=1, compile=True)
    twin = copy.deepcopy(original.model)  # deepcopy skips __init__: the twin must not borrow the original's keys
    with torch.no_grad():
        for param in twin.parameters():
            param.mul_(1.5)
    copied = RolloutEngine(twin, eos_token_ids=[3], max_num_seqs=1, compile=True)
    reference = RolloutEngine(copy.deepcopy(twin), eos_token_ids=[3], max_num_seqs=1)
    prompts = [[5, 6, 7]]
    original.generate(prompts, GREEDY)
    assert_same_outputs(copied.generate(prompts, GREEDY), reference.generate(prompts, GREEDY))
