// Drives `specloop serve` with the official `openai` npm client: one completion, one stream,
// one bad request, and the same through the chat API (chat.completions.create); then log-probs
// through both APIs. Prints one JSON object for openai_client_test.cc to check.
// Usage: node openai_client.mjs BASE_URL MODEL (NODE_PATH points at the installed client)
import { createRequire } from 'module';
const require = createRequire(process.env.SPECLOOP_NODE_DIR + '/');
const OpenAI = require('openai');

const [baseURL, model] = process.argv.slice(2);
const client = new (OpenAI.default || OpenAI)({ baseURL, apiKey: 'unused', maxRetries: 0 });
const prompt = 'And God said, Let there be';

const out = {};
const done = await client.completions.create({
  model, prompt, max_tokens: 24, temperature: 0, domain: 'prose',
});
out.text = done.choices[0].text;
out.finish_reason = done.choices[0].finish_reason;
out.usage = done.usage;
out.speculative = done.speculative;

const stream = await client.completions.create({
  model, prompt, max_tokens: 24, temperature: 0, stream: true,
});
out.stream_text = '';
out.stream_chunks = 0;
for await (const chunk of stream) {
  out.stream_text += chunk.choices[0].text;
  out.stream_chunks += 1;
  if (chunk.choices[0].finish_reason) out.stream_finish_reason = chunk.choices[0].finish_reason;
}

try {
  await client.completions.create({ model: 'no-such-model', prompt, max_tokens: 4 });
  out.bad_model_status = 200;
} catch (e) {
  out.bad_model_status = e.status;
  out.bad_model_message = e.error?.message ?? e.message;
}
// Chat: the fixture model has no chat template, so the server's default renders the messages.
const messages = [
  { role: 'system', content: 'You write about the Bible.' },
  { role: 'user', content: prompt },
];
const chat = await client.chat.completions.create({
  model, messages, max_tokens: 24, temperature: 0, domain: 'prose',
});
out.chat_content = chat.choices[0].message.content;
out.chat_role = chat.choices[0].message.role;
out.chat_object = chat.object;
out.chat_finish_reason = chat.choices[0].finish_reason;
out.chat_usage = chat.usage;
out.chat_speculative = chat.speculative;

const chatStream = await client.chat.completions.create({
  model, messages, max_completion_tokens: 24, temperature: 0, stream: true,
});
out.chat_stream_content = '';
out.chat_stream_chunks = 0;
for await (const chunk of chatStream) {
  const delta = chunk.choices[0].delta;
  if (out.chat_stream_chunks === 0) out.chat_stream_first_role = delta.role ?? null;
  out.chat_stream_content += delta.content ?? '';
  out.chat_stream_chunks += 1;
  if (chunk.choices[0].finish_reason) {
    out.chat_stream_finish_reason = chunk.choices[0].finish_reason;
  }
}
// The client's helper that assembles a streamed message.
const runner = client.beta.chat.completions.stream({
  model, messages, max_tokens: 24, temperature: 0,
});
out.chat_helper_content = (await runner.finalChatCompletion()).choices[0].message.content;

try {
  await client.chat.completions.create({ model, messages: [], max_tokens: 4 });
  out.chat_bad_status = 200;
} catch (e) {
  out.chat_bad_status = e.status;
  out.chat_bad_message = e.error?.message ?? e.message;
}

// Log-probs: completions (logprobs 3) and chat (logprobs with top_logprobs 2), whole and
// streamed; the client's stream helper assembles the chat entries across chunks.
const lp = await client.completions.create({
  model, prompt, max_tokens: 8, temperature: 0, logprobs: 3,
});
out.lp_text = lp.choices[0].text;
out.lp = lp.choices[0].logprobs;
const lpStream = await client.completions.create({
  model, prompt, max_tokens: 8, temperature: 0, logprobs: 3, stream: true,
});
out.lp_stream_tokens = [];
for await (const chunk of lpStream) {
  out.lp_stream_tokens.push(...(chunk.choices[0].logprobs?.tokens ?? []));
}
const chatLp = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
});
out.chat_lp_message = chatLp.choices[0].message.content;
out.chat_lp_content = chatLp.choices[0].logprobs.content;
const lpRunner = client.beta.chat.completions.stream({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
});
out.chat_lp_helper_content =
    (await lpRunner.finalChatCompletion()).choices[0].logprobs?.content ?? null;
try {
  await client.completions.create({ model, prompt, max_tokens: 4, logprobs: 21 });
  out.lp_bad_status = 200;
} catch (e) {
  out.lp_bad_status = e.status;
}

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
