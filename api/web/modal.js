// The drill-down for one task: what a person checks it by (the input the model saw, the reference, the extracted
// answer and the rule that found it, the output; issue 21), then every trial's outcome, score, score_meta, output
// and error (GET /tasks/{index}); for a product-sandbox run, the agent's steps on the task (docs/agents.md).

import { api, ApiError } from "./api.js";
import { h, json } from "./dom.js";

export async function openTask(runId, index) {
  const content = h("div", { class: "modal-body" }, h("p", { class: "muted" }, "Loading…"));
  const close = h("button", { class: "close", id: "modal-close", "aria-label": "close" }, "×");
  const dialog = h("dialog", { id: "task-modal", class: "modal", dataset: { index: String(index) } },
    h("header", {}, h("h2", {}, `Task ${index}`), close), content);
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => dialog.remove());
  dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); });
  document.getElementById("task-modal")?.remove();
  document.body.append(dialog);
  dialog.showModal();
  try {
    const task = await api(`/v1/runs/${encodeURIComponent(runId)}/tasks/${index}`);
    content.replaceChildren(
      h("dl", { class: "facts" },
        h("dt", {}, "outcome"), h("dd", {}, h("span", { class: `pill outcome-${task.outcome}` }, task.outcome)),
        h("dt", {}, "score"), h("dd", {}, task.score ?? "–"),
        h("dt", {}, "trial scores"), h("dd", { class: "mono" }, JSON.stringify(task.trial_scores)),
        h("dt", {}, "invocation"), h("dd", {}, task.invocation)),
      audit(task),
      h("table", { class: "grid trials" },
        h("thead", {}, h("tr", {}, ["Trial", "Outcome", "Score", "score_meta", "Output", "Error"]
          .map((c) => h("th", {}, c)))),
        h("tbody", {}, task.trials.map((t) => h("tr", { class: "trial-row", dataset: { trial: String(t.trial),
                                                                                       outcome: t.outcome } },
          h("td", { class: "num" }, t.trial),
          h("td", {}, h("span", { class: `pill outcome-${t.outcome}` }, t.outcome)),
          h("td", { class: "num" }, t.score ?? "–"),
          h("td", {}, h("pre", {}, json(t.meta))),
          h("td", {}, h("pre", {}, t.output ?? "")),
          h("td", {}, t.error ? h("pre", { class: "error" }, t.error) : ""))))),
      agentSteps(task.agent || []));
  } catch (err) {
    const text = err instanceof ApiError && err.status === 404 ? "This task has not settled yet." : err.message;
    content.replaceChildren(h("p", { class: "muted" }, text));
  }
  return dialog;
}

function audit(task) {
  const answer = task.extracted === false ? h("span", { class: "outcome-fail pill" }, "no answer found")
    : task.answer ?? h("span", { class: "muted" }, "–");
  const block = (text) => (text === null || text === undefined ? h("span", { class: "muted" }, "– (not recorded)")
    : h("pre", {}, text));
  return h("dl", { class: "facts audit", id: "task-audit" },
    h("dt", {}, "input"), h("dd", { dataset: { field: "input" } }, block(task.input)),
    h("dt", {}, "reference"), h("dd", { dataset: { field: "reference" } }, task.reference ?? "–"),
    h("dt", {}, "extracted"), h("dd", { dataset: { field: "extracted" } }, answer),
    h("dt", {}, "rule"), h("dd", { dataset: { field: "rule" } }, task.rule ?? "–"),
    h("dt", {}, "output"), h("dd", { dataset: { field: "output" } }, block(task.output)));
}

function agentSteps(steps) {
  if (!steps.length) return "";
  const what = (s) => (s.type === "AgentTextEvent" ? s.data.text
    : s.type === "ToolCallEvent" ? json(s.data.arguments) : s.data.content);
  return h("table", { class: "grid agent-steps", id: "agent-steps" },
    h("thead", {}, h("tr", {}, ["Turn", "Step", "Tool", "OK", "Content"].map((c) => h("th", {}, c)))),
    h("tbody", {}, steps.map((s) => h("tr", { class: "agent-step", dataset: { type: s.type } },
      h("td", { class: "num" }, s.data.step ?? ""),
      h("td", {}, s.type.replace("Event", "")),
      h("td", {}, s.data.name ?? ""),
      h("td", {}, s.type === "ToolResultEvent" ? (s.data.ok ? "yes" : "no") : ""),
      h("td", {}, h("pre", {}, what(s) ?? ""))))));
}
