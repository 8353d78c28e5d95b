// End-to-end check of the ApiServer with the official `openai` npm client (run by
// openai_client_test.cpp against a server over the FakeEngine, and by tests/e2e/serve_e2e_test.cpp
// against `afd launch`, both with the DeepSeek-V3 tokenizer): completions, chat, streaming, n
// with a seed, logprobs and an error. Prints "ok" and exits 0, or prints what failed and exits 1.
// Usage: node openai_client.mjs BASE_URL API_KEY [MODEL (default test-model)]
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, apiKey, model = "test-model"] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const completion = await client.completions.create({
  model, prompt: "Hello, my name is", max_tokens: 8, temperature: 0,
});
assert.equal(completion.object, "text_completion");
assert.equal(completion.choices.length, 1);
assert.equal(completion.choices[0].finish_reason, "length");
assert.equal(completion.usage.completion_tokens, 8);

const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say hi" }], max_completion_tokens: 6,
  temperature: 0, logprobs: true, top_logprobs: 3,
});
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.choices[0].logprobs.content.length, 6);
assert.equal(chat.choices[0].logprobs.content[0].top_logprobs.length, 3);

// Streaming: the streamed text equals the non-streamed one, the usage chunk comes last.
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say hi" }], max_completion_tokens: 6,
  temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "", finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(text, chat.choices[0].message.content);
assert.equal(finish, "length");
assert.equal(usage.completion_tokens, 6);

// n with a seed: reproducible, and the choices differ.
const seeded = { model, prompt: "Once", max_tokens: 5, n: 3, seed: 7, temperature: 0.9 };
const a = await client.completions.create(seeded);
const b = await client.completions.create(seeded);
assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
assert.notEqual(a.choices[0].text, a.choices[1].text);

const lp = await client.completions.create({ model, prompt: "Hi", max_tokens: 3, logprobs: 2 });
assert.equal(lp.choices[0].logprobs.tokens.length, 3);
const token_logprobs = lp.choices[0].logprobs.token_logprobs;
assert.ok(token_logprobs.every((x) => x <= 0), String(token_logprobs));

// Errors surface as the client's typed errors.
try {
  await client.completions.create({ model, prompt: "x", temperature: -1 });
  assert.fail("no error");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, String(e));
  assert.equal(e.status, 400);
}
try {
  await client.completions.create({ model: "nope", prompt: "x" });
  assert.fail("no error");
} catch (e) {
  assert.ok(e instanceof OpenAI.NotFoundError, String(e));
}
const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
try {
  await bad.models.list();
  assert.fail("no error");
} catch (e) {
  assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
}
const models = await client.models.list();
assert.equal(models.data[0].id, model);
console.log("ok");
