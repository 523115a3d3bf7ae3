// The same agent loop through the official openai Node SDK (default settings: it retries what it
// judges retryable, twice). The SDK's fetch is wrapped only to count the HTTP requests it sends, so
// a retry shows as one more attempt than turns.
//
//   node --import tsx sdk_loop.ts BASE_URL WORKSPACE "the task"
//
// The last line on stdout is one JSON object: answer, turns, executions, attempts, and after an API
// error its status, code, type and message. Exit 0 with an answer, 1 past the turn limit, 2 on an
// API error.
import OpenAI, { APIError } from "openai";
import { makeTools, toolSchemas } from "./tools.ts";

const [BASE_URL, WORKSPACE, TASK] = process.argv.slice(2);
const MAX_TURNS = Number(process.env.LOOP_MAX_TURNS ?? 60);
const tools = makeTools(WORKSPACE);
let attempts = 0;
let executions = 0;
let turns = 0;
const client = new OpenAI({
  baseURL: BASE_URL,
  apiKey: "sk-client",
  fetch: (url: any, init: any) => { attempts++; return fetch(url, init); },
});
const messages: any[] = [
  { role: "system", content: "You work in a folder of files. Use the tools, then answer." },
  { role: "user", content: TASK },
];
const done = (extra: object, code: number) => {
  console.log(JSON.stringify({ turns, executions, attempts, ...extra }));
  process.exit(code);
};

while (turns < MAX_TURNS) {
  turns++;
  let reply: any;
  try {
    const completion = await client.chat.completions.create({ model: "fake", messages, tools: toolSchemas as any });
    reply = completion.choices[0].message;
  } catch (err) {
    if (!(err instanceof APIError)) throw err;
    done({ status: err.status, code: err.code, type: err.type, message: err.message }, 2);
  }
  messages.push(reply);
  if (!reply.tool_calls?.length) done({ answer: reply.content }, 0);
  for (const call of reply.tool_calls) {
    let result: string;
    try {
      const tool = tools[call.function.name];
      if (!tool) throw new Error(`no tool named ${call.function.name}`);
      const args = JSON.parse(call.function.arguments);
      executions++;
      result = tool(args);
    } catch (err) {
      result = `error: ${(err as Error).message}`;
    }
    messages.push({ role: "tool", tool_call_id: call.id, content: result });
  }
}
done({ answer: null }, 1);
