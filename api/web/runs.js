// The runs list: newest first, filtered by display status and model (kept in the hash, so a filtered list is a
// link), refreshed every few seconds while the tab is visible so running rows move on their own.

import { api } from "./api.js";
import { h, pct, runDuration, statusBadge, usd, when } from "./dom.js";

const STATUSES = ["running", "ok", "error", "halted", "killed", "waiting", "paused"];
const PAGE = 100;
const REFRESH_MS = 3000;

export function runsView(root, params) {
  let runs = [];
  let cursor = null;
  let olderLoaded = false;
  let knownModels = null;
  const status = h("select", { id: "filter-status", "aria-label": "status" },
    h("option", { value: "" }, "any status"), STATUSES.map((s) => h("option", { value: s }, s)));
  const model = h("select", { id: "filter-model", "aria-label": "model" }, h("option", { value: "" }, "any model"));
  status.value = params.get("status") ?? "";
  const body = h("tbody", { id: "runs-body" });
  const more = h("button", { id: "load-more", hidden: true }, "Older runs");
  const note = h("p", { class: "muted", id: "runs-note" });
  root.append(
    h("section", { class: "runs" },
      h("div", { class: "toolbar" }, h("h1", {}, "Runs"), h("label", {}, "Status ", status),
        h("label", {}, "Model ", model)),
      h("table", { class: "grid", id: "runs-table" },
        h("thead", {}, h("tr", {}, ["Status", "Run", "Model", "Driver", "Dataset", "Pass rate", "Cost",
          "Started", "Duration"].map((c) => h("th", {}, c)))),
        body),
      note, more));

  function filters() {
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (model.value) q.set("model", model.value);
    const hash = `#/runs${q.toString() ? `?${q}` : ""}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
    render();
  }
  status.addEventListener("change", filters);
  model.addEventListener("change", filters);

  function render() {
    const models = [...new Set(runs.map((r) => r.model))].sort();
    if (models.join("\n") !== knownModels) { // rebuilt only when it changed: an open dropdown stays open
      const wanted = model.value || params.get("model") || "";
      model.replaceChildren(h("option", { value: "" }, "any model"), ...models.map((m) => h("option", { value: m }, m)));
      model.value = models.includes(wanted) ? wanted : "";
      knownModels = models.join("\n");
    }
    const shown = runs.filter((r) => (!status.value || r.display_status === status.value)
      && (!model.value || r.model === model.value));
    body.replaceChildren(...shown.map(row));
    note.textContent = runs.length === 0 ? "No runs yet: launch one with `benchwright run` or POST /v1/runs."
      : `${shown.length} of ${runs.length} loaded runs shown.`;
    more.hidden = !cursor;
  }

  function row(run) {
    const s = run.tasks.summary;
    const href = `#/runs/${encodeURIComponent(run.id)}`;
    const name = run.dataset.split(/[\\/]/).pop() || run.dataset;
    return h("tr", { class: "run-row", dataset: { runId: run.id, status: run.display_status },
                     onclick: (e) => { if (e.target.tagName !== "A") location.hash = href; } },
      h("td", {}, statusBadge(run.display_status)),
      h("td", {}, h("a", { href, class: "mono" }, run.id.slice(0, 8))),
      h("td", { class: "mono" }, run.model),
      h("td", {}, run.driver),
      h("td", { title: run.dataset }, name),
      h("td", { class: "num", title: `${s.passed} passed, ${s.failed} failed, ${s.errored} errored of ${s.total}` },
        pct(s.pass_rate)),
      h("td", { class: "num" }, usd(run.cost.incurred)),
      h("td", {}, when(run.created_at)),
      h("td", { class: "num" }, runDuration(run)));
  }

  async function load() {
    const page = await api(`/v1/ui/runs?limit=${PAGE}`);
    // Keep older pages the user loaded; the first page replaces what it covers.
    const fresh = new Map(page.runs.map((r) => [r.id, r]));
    const older = olderLoaded ? runs.filter((r) => !fresh.has(r.id)) : [];
    runs = [...page.runs, ...older];
    if (!olderLoaded) cursor = page.next_cursor;
    render();
  }

  more.addEventListener("click", async () => {
    const page = await api(`/v1/ui/runs?limit=${PAGE}&cursor=${encodeURIComponent(cursor)}`);
    olderLoaded = true;
    const seen = new Set(runs.map((r) => r.id));
    runs = [...runs, ...page.runs.filter((r) => !seen.has(r.id))];
    cursor = page.next_cursor;
    render();
  });

  load().catch((err) => { note.textContent = `Could not load runs: ${err.message}`; });
  const timer = setInterval(() => { if (!document.hidden) load().catch(() => {}); }, REFRESH_MS);
  return () => clearInterval(timer);
}
