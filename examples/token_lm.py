"""Trains a small causal language model for a few steps on documents packed into rows by
stoker.TokenDataset (best-fit packing), attention kept within each document.

    python examples/token_lm.py                       # a synthetic corpus made here
    python examples/token_lm.py --data train.bin --eod 50256 --vocab 50304   # nanoGPT's file
    python examples/token_lm.py --data /data/corpus_text_document --vocab 50304   # Megatron's

The synthetic corpus is learnable: each document counts up from a random token by a step of its
own (mod the vocabulary) and ends with the end-of-document token, so the loss falls as the model
learns to continue a document from its first tokens, and it only can if attention stays inside
the document. A row's `document_ids` give the mask (dense here; FlashAttention's varlen kernels
would take `cu_seqlens` instead), `position_ids` the positions, and `labels` (the next token of
the same document, -100 elsewhere) the loss (docs/formats.md, "Token data").
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker


def synthetic_corpus(path: str, documents: int, vocab: int, eod: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(documents):
        n = int(np.clip(rng.lognormal(np.log(40), 0.8), 4, 400))
        start, step = rng.integers(0, eod), rng.integers(1, 4)
        docs.append(np.append((start + step * np.arange(n - 1)) % eod, eod))
    np.concatenate(docs).astype(np.uint16).tofile(path)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 128, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids, document_ids):
        t = input_ids.shape[1]
        # Causal and within one document: token q sees token k <= q of its own document
        # (padding, document -1, sees only padding; its labels are -100).
        same = document_ids[:, :, None] == document_ids[:, None, :]
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        mask = (same & causal)[:, None]
        x = self.tokens(input_ids) + self.positions(position_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a Megatron prefix or a flat token file (with --eod)")
    ap.add_argument("--eod", type=int, help="end-of-document token of a flat file")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        data, eod = args.data, args.eod
        if data is None:
            data, eod = os.path.join(tmp, "train.bin"), args.vocab - 1
            synthetic_corpus(data, 4000, args.vocab, eod)
        ds = stoker.TokenDataset(data, args.seq_len, eod=eod, vocab_size=args.vocab,
                                 pack="best_fit", seed=0)
        print(f"{len(ds)} rows of {args.seq_len} tokens, {ds.plan()['fill']:.2%} not padding")
        loader = stoker.DataLoader(ds, batch_size=args.batch, shuffle=True, seed=0,
                                   num_workers=2)
        model = TinyLM(args.vocab, args.seq_len)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        step = 0
        while step < args.steps:
            for batch in loader:
                logits = model(batch["input_ids"], batch["position_ids"],
                               batch["document_ids"])
                loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                       ignore_index=-100)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 10 == 0 or step == args.steps - 1:
                    print(f"step {step:4d}  loss {loss.item():.3f}")
                step += 1
                if step == args.steps:
                    break


if __name__ == "__main__":
    main()
