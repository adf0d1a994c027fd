// The official `openai` npm client against `bluevm serve`: what a Node.js application sees.
//   node test.mjs BASE_URL API_KEY      (BASE_URL like http://127.0.0.1:8080/v1)
// The server must run stories260K with `--api-key API_KEY` (tests/test_openai_client.cpp starts
// it). Checks behaviour, not just the absence of exceptions: streamed text equals the plain text
// at temperature 0, log-probabilities are <= 0 and the greedy token is its own first
// alternative, a seed repeats its text, and errors arrive as the client's typed errors carrying
// the server's message.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
if (!baseURL || !apiKey) {
  console.error('usage: node test.mjs BASE_URL API_KEY');
  process.exit(2);
}

// No retries: a 429 or 5xx must fail the test, not be hidden by the client's backoff.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const prompt = 'Once upon a time';
const messages = [
  { role: 'system', content: 'Tell a story.' },
  { role: 'user', content: 'Hi' },
];
// stories260K's file has no chat template and no ChatML tokens in its vocabulary: BlueVM formats
// chats as ChatML (compiler/chat_template.h), and this text tokenizes the same as a plain prompt.
const chatMlPrompt =
  '<|im_start|>system\nTell a story.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n';

// Collects a stream: the text deltas, the finish reason, the usage chunk and the logprobs.
async function collect(stream, chat) {
  const out = { text: '', finish: null, usage: null, chunks: 0, logprobs: [] };
  for await (const chunk of stream) {
    if (chunk.usage) out.usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const c = chunk.choices[0];
    out.chunks++;
    out.text += chat ? (c.delta.content ?? '') : c.text;
    if (c.finish_reason) out.finish = c.finish_reason;
    if (c.logprobs) out.logprobs.push(...(chat ? c.logprobs.content : c.logprobs.token_logprobs));
  }
  return out;
}

// Runs `call`, which must fail with the client's `type` error, status and server message.
async function rejects(call, type, status, message, param) {
  await assert.rejects(call, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.ok(e instanceof type, `expected ${type.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.match(e.message, message);
    if (param !== undefined) assert.equal(e.param, param);
    return true;
  });
}

test('models.list names the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    assert.equal(m.object, 'model');
    ids.push(m.id);
  }
  assert.deepEqual(ids, ['stories260K']);
});

test('completions: plain and streamed carry the same greedy text; max_tokens and stop', async () => {
  const plain = await client.completions.create({
    model: 'stories260K', prompt, max_tokens: 40, temperature: 0,
  });
  assert.equal(plain.object, 'text_completion');
  const text = plain.choices[0].text;
  assert.ok(text.startsWith(', there was a little girl named Lily.'), text);
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.usage.completion_tokens, 40);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + 40);

  const streamed = await collect(await client.completions.create({
    model: 'stories260K', prompt, max_tokens: 40, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }), false);
  assert.equal(streamed.text, text);
  assert.ok(streamed.chunks >= 2, `${streamed.chunks} chunks`);
  assert.equal(streamed.finish, 'length');
  assert.equal(streamed.usage.completion_tokens, 40);

  const short = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 5, temperature: 0 });
  assert.equal(short.usage.completion_tokens, 5);
  assert.ok(text.startsWith(short.choices[0].text));

  const stopped = await client.completions.create({
    model: 'stories260K', prompt, max_tokens: 40, temperature: 0, stop: ['Lily'],
  });
  assert.equal(stopped.choices[0].text, text.slice(0, text.indexOf('Lily')));
  assert.equal(stopped.choices[0].finish_reason, 'stop');
});

test('usage: prompt_tokens_details.cached_tokens reports prefix reuse; cache_prompt: false recomputes', async () => {
  const ask = (extra) => client.completions.create({
    model: 'stories260K', prompt, max_tokens: 6, temperature: 0, ...extra,
  });
  const first = await ask({});
  const again = await ask({});
  const details = again.usage.prompt_tokens_details;
  assert.ok(details && Number.isInteger(details.cached_tokens), JSON.stringify(again.usage));
  // Which of the two instances takes it is the GPU's choice: at most all but the last token.
  assert.ok(details.cached_tokens >= 0 && details.cached_tokens <= again.usage.prompt_tokens - 1);
  assert.equal(again.choices[0].text, first.choices[0].text);
  const off = await ask({ cache_prompt: false });
  assert.equal(off.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(off.choices[0].text, first.choices[0].text);
});

test('chat: formatted with the chat template; plain and streamed agree', async () => {
  const plain = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0 });
  assert.equal(plain.object, 'chat.completion');
  const msg = plain.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.ok(msg.content.length > 0);
  // The template's text as a plain prompt gives the same tokens and the same answer.
  const same = await client.completions.create({ model: 'stories260K', prompt: chatMlPrompt, max_tokens: 24, temperature: 0 });
  assert.equal(plain.usage.prompt_tokens, same.usage.prompt_tokens);
  assert.equal(msg.content, same.choices[0].text);

  const streamed = await collect(await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }), true);
  assert.equal(streamed.text, msg.content);
  assert.equal(streamed.usage.completion_tokens, plain.usage.completion_tokens);
  assert.equal(streamed.finish, plain.choices[0].finish_reason);
});

test('completions logprobs: <= 0, greedy token first among its alternatives, streamed the same', async () => {
  const body = { model: 'stories260K', prompt, max_tokens: 12, temperature: 0, logprobs: 5 };
  const res = await client.completions.create(body);
  const lp = res.choices[0].logprobs;
  const n = res.usage.completion_tokens;
  assert.equal(lp.tokens.length, n);
  assert.equal(lp.token_logprobs.length, n);
  assert.equal(lp.top_logprobs.length, n);
  let offset = 0;
  for (let i = 0; i < n; i++) {
    const chosen = lp.token_logprobs[i];
    assert.ok(chosen <= 0, `token ${i}: ${chosen}`);
    assert.equal(lp.text_offset[i], offset);
    offset += lp.tokens[i].length;
    const top = Object.entries(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 5);
    const best = Math.max(...top.map(([, v]) => v));
    assert.equal(lp.top_logprobs[i][lp.tokens[i]], chosen);
    assert.equal(best, chosen);
    assert.ok(top.reduce((s, [, v]) => s + Math.exp(v), 0) <= 1 + 1e-5);
  }
  const streamed = await collect(await client.completions.create({ ...body, stream: true }), false);
  assert.deepEqual(streamed.logprobs, lp.token_logprobs);
  assert.equal(streamed.text, res.choices[0].text);
});

test('chat logprobs: top_logprobs sorted, the first is the chosen token, streamed the same', async () => {
  const body = { model: 'stories260K', messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 };
  const res = await client.chat.completions.create(body);
  const content = res.choices[0].logprobs.content;
  assert.equal(content.length, res.usage.completion_tokens);
  for (const e of content) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    for (let k = 1; k < 3; k++) assert.ok(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  }
  assert.equal(content.map((e) => e.token).join('').trimStart(), res.choices[0].message.content.trimStart());
  const streamed = await collect(await client.chat.completions.create({ ...body, stream: true }), true);
  assert.deepEqual(streamed.logprobs, content);
});

test('seed: the same seed repeats a sampled text; other seeds give other texts', async () => {
  const body = { model: 'stories260K', prompt: 'The dog', max_tokens: 30, temperature: 0.9, top_p: 0.9 };
  const a = await client.completions.create({ ...body, seed: 42 });
  const b = await client.completions.create({ ...body, seed: 42 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const others = new Set();
  for (const seed of [1, 2, 3]) others.add((await client.completions.create({ ...body, seed })).choices[0].text);
  others.add(a.choices[0].text);
  assert.ok(others.size >= 2, 'four seeds gave one text');
  const c1 = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 20, temperature: 1, seed: 7 });
  const c2 = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 20, temperature: 1, seed: 7 });
  assert.equal(c1.choices[0].message.content, c2.choices[0].message.content);
});

test('errors: a bad request is a BadRequestError (400) with the server message and field', async () => {
  await rejects(client.completions.create({ model: 'stories260K', prompt, temperature: 5 }),
    OpenAI.BadRequestError, 400, /'temperature' must be between 0 and 2, not 5/, 'temperature');
  await rejects(client.chat.completions.create({ model: 'stories260K', messages, n: 2 }),
    OpenAI.BadRequestError, 400, /'n' must be 1/, 'n');
  await rejects(client.completions.create({ model: 'stories260K', prompt, logprobs: 21 }),
    OpenAI.BadRequestError, 400, /'logprobs' must be between 0 and 20/, 'logprobs');
  await rejects(client.chat.completions.create({ model: 'stories260K', messages, top_logprobs: 2 }),
    OpenAI.BadRequestError, 400, /'top_logprobs' needs 'logprobs': true/, 'top_logprobs');
  await rejects(client.completions.create({ model: 'no-such-model', prompt }),
    OpenAI.NotFoundError, 404, /no-such-model/);
  // The server still serves after them.
  const ok = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 2, temperature: 0 });
  assert.equal(ok.usage.completion_tokens, 2);
});

// Structured output: response_format json_schema and json_object (applied by the GPU sampler).
test('chat: response_format json_schema gives JSON valid against the schema', async () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 8 }, mood: { enum: ['happy', 'sad'] } },
    required: ['name', 'mood'],
  };
  const r = await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 80, temperature: 0.8, seed: 9,
    response_format: { type: 'json_schema', json_schema: { name: 'kid', schema, strict: true } },
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const value = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(value), ['name', 'mood']);
  assert.equal(typeof value.name, 'string');
  assert.ok([...value.name].length <= 8);
  assert.ok(['happy', 'sad'].includes(value.mood));
  // Streamed, the same seed gives the same text.
  const s = await collect(await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 80, temperature: 0.8, seed: 9, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'kid', schema } },
  }), true);
  assert.equal(s.text, r.choices[0].message.content);
  const o = await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 20, temperature: 0, response_format: { type: 'json_object' },
  });
  assert.ok(o.choices[0].message.content.startsWith('{'));
});

// Tools: a required answer comes back as tool_calls (several, parallel calls being the default),
// each with its own id and arguments valid against the parameters; with parallel_tool_calls
// false, exactly one.
test('chat: tools with tool_choice required answer tool calls, one without parallel calls', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] },
    },
  }];
  for (const parallel of [true, false]) {
    const r = await client.chat.completions.create({
      model: 'stories260K', messages: [{ role: 'user', content: 'Weather?' }], tools, tool_choice: 'required',
      parallel_tool_calls: parallel, max_tokens: 300, temperature: 0.7, seed: 2,
    });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls.length >= 1);
    if (!parallel) assert.equal(calls.length, 1);
    assert.equal(new Set(calls.map((c) => c.id)).size, calls.length);
    for (const call of calls) {
      assert.equal(call.type, 'function');
      assert.equal(call.function.name, 'get_weather');
      const args = JSON.parse(call.function.arguments);
      assert.equal(typeof args.city, 'string');
      assert.ok([...args.city].length <= 10);
    }
  }
});

// The client asks for base64 when no encoding_format is given and decodes it: the same numbers as
// the float form. The server pools by mean (tests/test_openai_client.cpp starts it with --pooling).
test('embeddings: unit vectors in input order; base64 (the client default) equals float; dimensions', async () => {
  const r = await client.embeddings.create({ model: 'stories260K', input: [prompt, 'The cat sat.'] });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, 2);
  for (const [i, d] of r.data.entries()) {
    assert.equal(d.index, i);
    assert.equal(d.embedding.length, 64);
    assert.ok(Math.abs(Math.hypot(...d.embedding) - 1) < 1e-5);
  }
  assert.ok(r.usage.prompt_tokens > 2);
  const f = await client.embeddings.create({ model: 'stories260K', input: prompt, encoding_format: 'float' });
  assert.deepEqual(Array.from(f.data[0].embedding), Array.from(r.data[0].embedding));
  const cut = await client.embeddings.create({ model: 'stories260K', input: prompt, dimensions: 8 });
  assert.equal(cut.data[0].embedding.length, 8);
  assert.ok(Math.abs(Math.hypot(...cut.data[0].embedding) - 1) < 1e-5);
  await rejects(client.embeddings.create({ model: 'stories260K', input: '' }), OpenAI.BadRequestError, 400,
    /'input' is empty/, 'input');
});

// A schema the server cannot follow is refused with 400 naming the field, never ignored.
test('errors: an unsupported schema keyword is refused with 400', async () => {
  await rejects(client.chat.completions.create({
    model: 'stories260K', messages,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } },
  }), OpenAI.BadRequestError, 400, /pattern/, 'response_format');
});

test('errors: a wrong API key is an AuthenticationError (401)', async () => {
  const wrong = new OpenAI({ baseURL, apiKey: `${apiKey}-wrong`, maxRetries: 0, timeout: 60_000 });
  await rejects(wrong.models.list(), OpenAI.AuthenticationError, 401, /a valid API key is required/);
  await rejects(wrong.completions.create({ model: 'stories260K', prompt, max_tokens: 2 }),
    OpenAI.AuthenticationError, 401, /a valid API key is required/);
  await assert.rejects(wrong.completions.create({ model: 'stories260K', prompt, max_tokens: 2 }),
    (e) => e.code === 'invalid_api_key');
});
