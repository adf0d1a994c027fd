#!/usr/bin/env python3
# A six-turn conversation on `bluevm serve --instances 4 --sessions S`, with four other requests
# before each turn; each turn's prompt is the conversation so far plus a new sentence.
#   python3 tools/bench_sessions.py PORT session|none TAG   (TAG names the conversation)
# Prints per turn the latency, prompt tokens and cached tokens, then the totals.
import json, sys, time, urllib.request, concurrent.futures as cf
port = int(sys.argv[1]); use_session = sys.argv[2] == "session"; tag = sys.argv[3] if len(sys.argv) > 3 else "x"
base = f"http://127.0.0.1:{port}"
def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())
history = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun."
lines = [" One day, she found a shiny red ball in the grass.", " She ran to show her mom the ball.",
         " Her mom smiled and said they could play together.", " They played until the sun went down.",
         " Then Lily went inside and ate her dinner.", " After dinner, she read a book about a dog."]
tot_lat = tot_prompt = tot_cached = 0
for k, line in enumerate(lines):
    with cf.ThreadPoolExecutor(4) as ex:  # other traffic: replaces the instances' own rows
        list(ex.map(lambda i: post({"prompt": f"The cat number {i} {tag} {k} sat on a mat and looked at the bird in the tree.", "max_tokens": 16, "temperature": 0}), range(4)))
    history += line
    body = {"prompt": history, "max_tokens": 32, "temperature": 0}
    if use_session: body["session_id"] = "conv-" + tag
    t = time.time(); r = post(body); lat = time.time() - t
    u = r["usage"]; cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    history += r["choices"][0]["text"]
    tot_lat += lat; tot_prompt += u["prompt_tokens"]; tot_cached += cached
    print(f"turn {k}: {lat*1000:.0f} ms, prompt {u['prompt_tokens']}, cached {cached}")
print(f"{'session' if use_session else 'no session'}: {tot_lat:.2f} s over 6 turns, prompt tokens {tot_prompt}, recomputed {tot_prompt - tot_cached}")
