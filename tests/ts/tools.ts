// The tools the TypeScript clients share (loop.ts, sdk_loop.ts): each does real work in a folder.
// `tools` is the code that runs (the model never sees it), `toolSchemas` what the model sees.
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

type Args = Record<string, any>;

export function makeTools(WORKSPACE: string): Record<string, (args: Args) => string> {
  const at = (path: string) => join(WORKSPACE, path);
  let polls = 0;

  return {
    read_file: ({ path, encoding = "utf-8" }) =>
      existsSync(at(path)) ? readFileSync(at(path), encoding as BufferEncoding)
        : JSON.stringify({ ok: false, error: "missing_file", path }),
    list_dir: ({ path = "." }) => readdirSync(at(path)).sort().join("\n"),
    read_page: ({ path, page }) =>
      `page ${page} of 5 of ${path}: lorem ipsum ${page}\n` +
      `[${page >= 5 ? "end of document" : `call read_page with page=${page + 1} for more`}]`,
    job_status: () => (++polls >= 8 ? "done" : "running"),
    record: ({ note }) => {
      writeFileSync(at("notes.txt"), `${note}\n`, { flag: "a" });
      return "ok";
    },
    write_file: ({ path, content }) => {
      mkdirSync(dirname(at(path)), { recursive: true });
      writeFileSync(at(path), content);
      return `wrote ${content.length} characters to ${path}`;
    },
    // a line ending in `# ok` is a passing test, `# bug` a failing one
    run_tests: ({ path }) => {
      if (!existsSync(at(path))) return `no module ${path}`;
      const lines = readFileSync(at(path), "utf-8").split("\n").map((l) => l.trimEnd());
      const passed = lines.filter((l) => l.endsWith("# ok")).length;
      const failed = lines.filter((l) => l.endsWith("# bug")).length;
      return failed ? `${failed} failed, ${passed} passed` : `${passed} passed`;
    },
  };
}

// What the model sees: a name, a description and a JSON schema per tool.
const fn = (name: string, description: string, properties: Args, required: string[]) =>
  ({ type: "function", function: { name, description, parameters: { type: "object", properties, required } } });
const str = { type: "string" };
export const toolSchemas = [
  fn("read_file", "Read a text file of the workspace.",
     { path: str, encoding: { type: "string", default: "utf-8" } }, ["path"]),
  fn("list_dir", "List a folder of the workspace.", { path: { type: "string", default: "." } }, []),
  fn("read_page", "Read one page of a long document.", { path: str, page: { type: "integer" } }, ["path", "page"]),
  fn("job_status", "Check whether a background job has finished.", { job_id: str }, ["job_id"]),
  fn("record", "Record a note.", { note: str }, ["note"]),
  fn("write_file", "Write a text file in the workspace, replacing it.", { path: str, content: str }, ["path", "content"]),
  fn("run_tests", "Run the tests of a module.", { path: str }, ["path"]),
];

