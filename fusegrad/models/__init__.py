"""Pretrained models built from fusegrad Tensors: text models (BERT sentence embeddings, GPT-2, LLaMA) and their
tokenizers. Each loads Hugging Face checkpoints (safetensors or PyTorch .bin) with fusegrad's own readers."""
