#!/usr/bin/env python3
"""The cuda_ipc KV transport on one GPU (issue 40 item 4), vLLM's proxy protocol spoken directly:
a producer `afd serve` (kv_producer, transport cuda_ipc) and two consumers on the same GPU, one
taking rows over CUDA IPC (cuda_ipc) and one over TCP (tcp). Each prompt is prefilled twice on
the producer; one decode leg goes to each consumer. Checks: both consumers give identical token
ids (the same rows reached both caches), the IPC consumer counted every pull as device
(afd:kv_transfer_device_total) and the TCP one none, and the producer's cache is empty at the
end (every IPC read released its blocks). Prints one line per check; exits 1 on a failure.

Usage: pd_ipc_check.py AFD MODEL_DIR LOG_DIR [--prompts 8]
"""
import argparse, json, os, socket, subprocess, sys, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("afd")
ap.add_argument("model")
ap.add_argument("logs")
ap.add_argument("--prompts", type=int, default=8)
ap.add_argument("--cpu-dry-run", action="store_true",
                help="the same flow on the CPU over tcp only (checks this script, not CUDA IPC)")
A = ap.parse_args()
IPC = "tcp" if A.cpu_dry_run else "cuda_ipc"
DEVICE = "cpu" if A.cpu_dry_run else "cuda"
os.makedirs(A.logs, exist_ok=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def kv(role, transport, kv_port=None):
    c = {"kv_connector": "AfdKvConnector", "kv_role": role,
         "kv_connector_extra_config": {"transport": transport}}
    if kv_port:
        c.update(kv_ip="127.0.0.1", kv_port=kv_port)
    return json.dumps(c)


procs = []
def serve(name, port, kvconf):
    log = open(f"{A.logs}/{name}.log", "w")
    p = subprocess.Popen([A.afd, "serve", A.model, "--device", DEVICE, "--host", "127.0.0.1",
                          "--port", str(port), "--kv-transfer-config", kvconf,
                          "--num-gpu-blocks-override", "512"], stdout=log, stderr=subprocess.STDOUT)
    procs.append((name, p))
    return p


ports = {n: free_port() for n in ("producer", "ipc", "tcp")}
serve("producer", ports["producer"], kv("kv_producer", IPC, free_port()))
serve("ipc", ports["ipc"], kv("kv_consumer", IPC))
serve("tcp", ports["tcp"], kv("kv_consumer", "tcp"))
ok = True
try:
    for name, p in procs:
        log = f"{A.logs}/{name}.log"
        for _ in range(1200):
            if "the OpenAI API is up" in open(log).read():
                break
            if p.poll() is not None:
                sys.exit(f"{name} exited: {open(log).read()[-2000:]}")
            time.sleep(0.1)
    outs = {"ipc": [], "tcp": []}
    for i in range(A.prompts):
        prompt = [(t * 31 + i * 7) % 997 + 3 for t in range(40 + i * 150)]
        base = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        for consumer in ("ipc", "tcp"):
            pre = post(ports["producer"], dict(base, max_tokens=1,
                                              kv_transfer_params={"do_remote_decode": True}))
            params = pre["kv_transfer_params"]
            dec = post(ports[consumer], dict(base, kv_transfer_params=params))
            outs[consumer].append(dec["choices"][0]["token_ids"])
    same = sum(a == b for a, b in zip(outs["ipc"], outs["tcp"]))
    print(f"[pd_ipc] {A.prompts} prompts of 40-{40 + (A.prompts - 1) * 150} tokens: CUDA IPC consumer "
          f"== TCP consumer for {same}/{A.prompts}")
    ok &= same == A.prompts
    dev_ipc, dev_tcp = metric(ports["ipc"], "afd:kv_transfer_device_total"), metric(ports["tcp"], "afd:kv_transfer_device_total")
    b_ipc = metric(ports["ipc"], "afd:kv_transfer_bytes_total")
    s_ipc = metric(ports["ipc"], "afd:kv_transfer_seconds_sum")
    s_tcp = metric(ports["tcp"], "afd:kv_transfer_seconds_sum")
    b_tcp = metric(ports["tcp"], "afd:kv_transfer_bytes_total")
    print(f"[pd_ipc] device pulls: ipc consumer {dev_ipc:.0f}, tcp consumer {dev_tcp:.0f}; "
          f"bytes ipc {b_ipc / 1e6:.2f} MB tcp {b_tcp / 1e6:.2f} MB; pull time ipc "
          f"{s_ipc * 1e3:.1f} ms, tcp {s_tcp * 1e3:.1f} ms in all")
    ok &= dev_ipc == (0 if A.cpu_dry_run else A.prompts) and dev_tcp == 0 and b_ipc == b_tcp
    usage = 1.0
    for _ in range(50):  # the releases run on their own threads
        usage = metric(ports["producer"], "vllm:kv_cache_usage_perc")
        if usage == 0:
            break
        time.sleep(0.1)
    print(f"[pd_ipc] producer cache usage after the transfers: {usage}")
    ok &= usage == 0
finally:
    for name, p in procs:
        p.terminate()
    for name, p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
print("[pd_ipc] " + ("passed" if ok else "FAILED"))
sys.exit(0 if ok else 1)
