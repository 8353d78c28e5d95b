"""A careful PyTorch peer for Qwen3-30B-A3B decode on one GPU, written like ../shared/bench/torch_peer.py
(DeepSeek-V2-Lite's): bf16 random weights, GQA with q_norm / k_norm and rotate-half rope over a dense
per-sequence key/value cache (SDPA with enable_gqa), softmax router with renormalised top-8,
torch._grouped_mm experts, one decode step captured as a CUDA graph. Prints ms/step eager and graphed per
batch size.
Usage: python3 qwen3_torch_peer.py OUT.json [context] [batches, e.g. 1,16,64] [layers (48)]"""
import json, sys, time, torch, torch.nn.functional as F
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
H, NH, KVH, D, V = 2048, 32, 4, 128, 151936
E, TOPK, I = 128, 8, 768
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 128
L = int(sys.argv[4]) if len(sys.argv) > 4 else 48
def w(*s): return (torch.randn(*s, device=dev, dtype=dt) * 0.02)
layers = [dict(ln1=torch.ones(H, device=dev, dtype=dt), ln2=torch.ones(H, device=dev, dtype=dt),
               qn=torch.ones(D, device=dev, dtype=dt), kn=torch.ones(D, device=dev, dtype=dt),
               wqkv=w((NH + 2 * KVH) * D, H), wo=w(H, NH * D), gate=w(E, H),
               egu=w(E, 2 * I, H), edn=w(E, H, I)) for _ in range(L)]
emb, lnf, head = w(V, H), torch.ones(H, device=dev, dtype=dt), w(V, H)
cos = torch.randn(D // 2, device=dev, dtype=torch.float32).cos()
sin = torch.randn(D // 2, device=dev, dtype=torch.float32).sin()
def rms(x, g): return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * g
def rope(x):
    x1, x2 = x.float()[..., : D // 2], x.float()[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(dt)
def step(ids, kc, vc):
    x = emb[ids]
    B = x.shape[0]
    for l, d in enumerate(layers):
        h = rms(x, d["ln1"])
        qkv = h @ d["wqkv"].t()
        q = rope(rms(qkv[:, : NH * D].view(B, NH, D), d["qn"]))
        k = rope(rms(qkv[:, NH * D:(NH + KVH) * D].view(B, KVH, D), d["kn"]))
        kc[l][:, :, -1] = k; vc[l][:, :, -1] = qkv[:, (NH + KVH) * D:].view(B, KVH, D)
        o = F.scaled_dot_product_attention(q[:, :, None], kc[l], vc[l], enable_gqa=True)
        x = x + o.reshape(B, NH * D) @ d["wo"].t()
        h = rms(x, d["ln2"])
        probs = (h.float() @ d["gate"].float().t()).softmax(-1)
        tw, ti = probs.topk(TOPK, -1)
        tw = tw / tw.sum(-1, keepdim=True)
        flat = ti.flatten(); order = flat.argsort(stable=True)
        tok = order // TOPK
        counts = torch.zeros(E, device=dev, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)
        gu = torch._grouped_mm(h[tok], d["egu"].transpose(-2, -1), offs=offs)
        g, u = gu.chunk(2, -1)
        y = torch._grouped_mm((F.silu(g) * u).contiguous(), d["edn"].transpose(-2, -1), offs=offs)
        out = torch.zeros(B, H, device=dev, dtype=torch.float32)
        out.index_add_(0, tok, y.float() * tw.flatten()[order, None])
        x = x + out.to(dt)
    return rms(x, lnf) @ head.t()
res = {"context": ctx, "layers": L}
batches = [int(b) for b in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 16, 64, 256]
for B in batches:
    kc = [torch.randn(B, KVH, ctx + 1, D, device=dev, dtype=dt) * 0.1 for _ in range(L)]
    vc = [torch.randn(B, KVH, ctx + 1, D, device=dev, dtype=dt) * 0.1 for _ in range(L)]
    ids = torch.randint(0, V, (B,), device=dev)
    with torch.no_grad():
        for _ in range(3): step(ids, kc, vc)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(10): step(ids, kc, vc)
        torch.cuda.synchronize(); eager = (time.perf_counter() - t) / 10
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2): step(ids, kc, vc)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): out = step(ids, kc, vc)
        for _ in range(3): g.replay()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20): g.replay()
        torch.cuda.synchronize(); graphed = (time.perf_counter() - t) / 20
    res[B] = {"eager_ms": round(eager * 1e3, 2), "graph_ms": round(graphed * 1e3, 2), "graph_tok_s": round(B / graphed, 1)}
    print(B, res[B], flush=True)
    del kc, vc, g
    torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
