// An agent loop written like seed 003's loop.ts: nothing but `fetch`, HTTP and JSON, the four steps
// of the ring, and its own tools doing real work in a folder. It knows nothing of loopfence: point
// BASE_URL at `loopfence proxy` and the fence is on the wire.
//
//   node --import tsx loop.ts BASE_URL WORKSPACE "the task"
//
// Progress goes to stderr; the last line on stdout is one JSON object: the answer, the turns, the
// tool executions, and the two headers a proxy may add (read only to report them: the loop's
// stop gate is the model's reply, as in the seed). Exit 0 with an answer, 1 past the turn limit
// (break 1's fix), 2 when the endpoint answered an HTTP error.
import { makeTools, toolSchemas } from "./tools.ts";

type Call = { id: string; type: "function"; function: { name: string; arguments: string } };
type Message = { role: string; content: string | null; tool_calls?: Call[]; tool_call_id?: string };

const [BASE_URL, WORKSPACE, TASK] = process.argv.slice(2);
const MODEL = process.env.LOOP_MODEL ?? "fake";
const MAX_TURNS = Number(process.env.LOOP_MAX_TURNS ?? 60);
const tools = makeTools(WORKSPACE);
let executions = 0;

const messages: Message[] = [
  { role: "system", content: "You work in a folder of files. Use the tools, then answer." },
  { role: "user", content: TASK },
];
let stop: string | null = null;
let run: string | null = null;

for (let turn = 1; turn <= MAX_TURNS; turn++) {
  // 1. Send: all messages + tool schemas (the API remembers nothing)
  const res = await fetch(`${BASE_URL}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages, tools: toolSchemas }),
  });
  stop = res.headers.get("x-loopfence-stop") ?? stop;
  run = res.headers.get("x-loopfence-run") ?? run;
  const body = await res.json();
  if (!res.ok) {
    console.error(`· HTTP ${res.status}: ${JSON.stringify(body)}`);
    console.log(JSON.stringify({ error: body, status: res.status, turns: turn, executions, stop, run }));
    process.exit(2);
  }
  const reply: Message = body.choices[0].message;

  // 2. Remember: the reply is text, or tool calls
  messages.push(reply);

  // 3. Stop gate: no tool calls means this is the answer
  if (!reply.tool_calls?.length) {
    console.error(reply.content);
    console.log(JSON.stringify({ answer: reply.content, turns: turn, executions, stop, run }));
    process.exit(0);
  }

  // 4. Run tools: run each call, remember its result (an error too: break 2's fix), next turn
  for (const call of reply.tool_calls) {
    console.error(`→ ${call.function.name} ${call.function.arguments}`);
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
console.log(JSON.stringify({ answer: null, turns: MAX_TURNS, executions, stop, run }));
process.exit(1);
