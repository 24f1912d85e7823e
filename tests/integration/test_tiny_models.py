import pytest
import torch

from kvroute.models import tiny_model, tiny_tokenizer


@pytest.mark.parametrize("arch,cls", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_tiny_models_are_gqa_and_seeded(arch, cls):
    a = tiny_model(arch, seed=1)
    b = tiny_model(arch, seed=1)
    c = tiny_model(arch, seed=2)
    assert type(a.model).__name__ == cls
    assert (a.info.num_heads, a.info.num_kv_heads, a.info.num_layers) == (4, 2, 3)
    assert a.info.group_size == 2
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_tiny_model_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model("llama", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_tokenizer_chat_template_and_offsets():
    tok = tiny_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "Who lives in Ferravik?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWho lives in Ferravik?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")
    # offsets cover the text exactly
    pieces = "".join(text[s:e] for s, e in enc["offset_mapping"])
    assert pieces == text
