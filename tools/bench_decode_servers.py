#!/usr/bin/env python3
# Decode speed of one completion (256 tokens, greedy, ignore_eos) on servers started with
# different options, alternating, six rounds: what an embed block or a session store costs.
#   python3 tools/bench_decode_servers.py PORT1,PORT2,... NAME1,NAME2,...
import json, sys, time, urllib.request
ports = [int(p) for p in sys.argv[1].split(",")]; names = sys.argv[2].split(",")
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())
res = {n: [] for n in names}
for p in ports: post(p, {"prompt": "Lily", "max_tokens": 8, "temperature": 0})
for rnd in range(6):
    for p, n in zip(ports, names):
        t = time.time(); r = post(p, {"prompt": "Lily", "max_tokens": 256, "ignore_eos": True, "temperature": 0}); dt = time.time() - t
        res[n].append(r["usage"]["completion_tokens"] / dt)
for n in names:
    print(f"{n}: " + ", ".join(f"{x:.0f}" for x in res[n]) + f" tok/s (best {max(res[n]):.0f})")
