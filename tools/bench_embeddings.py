#!/usr/bin/env python3
# Embeddings against completions' prefill on one `bluevm serve --pooling P --queue Q` (Q at least
# N): N distinct inputs in one /v1/embeddings request, then the same texts as N concurrent
# completions with max_tokens 1 and cache_prompt false; three rounds.
#   python3 tools/bench_embeddings.py PORT [N]   (README: Embeddings, Measured)
import json, sys, time, urllib.request, concurrent.futures as cf
port = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
base = f"http://127.0.0.1:{port}"
words = "Lily and Ben went to the park to play with a red ball under the big green tree near the lake".split()
texts = [" ".join(words[(i * 7) % len(words):] + words[:(i * 7) % len(words)]) + f" number {i}." for i in range(n)]
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())
post("/v1/embeddings", {"input": texts[:2]})  # warm up
for rep in range(3):
    t = time.time(); e = post("/v1/embeddings", {"input": texts}); te = time.time() - t
    tok = e["usage"]["prompt_tokens"]
    t = time.time()
    with cf.ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(lambda s: post("/v1/completions", {"prompt": s, "max_tokens": 1, "temperature": 0, "cache_prompt": False}), texts))
    tc = time.time() - t
    ctok = sum(o["usage"]["prompt_tokens"] for o in outs)
    print(f"rep {rep}: embeddings {n} inputs {tok} tokens {te:.2f} s = {tok/te:.0f} tok/s; completions(max_tokens 1) {ctok} tokens {tc:.2f} s = {ctok/tc:.0f} tok/s; ratio {tc/te:.2f}")
