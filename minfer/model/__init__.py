"""Llama-family decoder over flattened token batches, its config, tokenizers and loader."""

from minfer.model.config import ModelConfig
from minfer.model.llama import LlamaModel
from minfer.model.loader import load_model, tiny_random_model
from minfer.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from minfer.ops.attention import Attention

__all__ = ["Attention", "ByteTokenizer", "HFTokenizer", "LlamaModel", "ModelConfig", "Tokenizer",
           "load_model", "tiny_random_model"]
