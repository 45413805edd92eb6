// Operator sessions (issue 26): the account's sessions (#/sessions) and one session's page (#/sessions/<id>):
// its goal, status and budget used, the runs it launched (linking to their run pages, with score and interval),
// its decision log and its answer with the evidence table. The page follows the session's log over SSE (the run
// page's stream, closing at SessionAnswered) and re-reads the session and its runs as events arrive, and every few
// seconds while it runs (its runs move between the operator's decisions).

import { api, followSession } from "./api.js";
import { h, json, ms, pct, usd, when } from "./dom.js";

const REFRESH_MS = 2000;
const LIST_REFRESH_MS = 3000;
const ENDED = ["answered", "stopped", "failed"];

export function sessionBadge(status) {
  const look = { answered: "ok", running: "running", paused: "paused", stopped: "killed", failed: "error" }[status];
  return h("span", { class: `badge status-${look ?? "killed"}`, dataset: { status } }, status);
}

const ci = (interval) => (interval ? `[${pct(interval[0])}, ${pct(interval[1])}]` : "–");
const runLink = (runId) => h("a", { href: `#/runs/${encodeURIComponent(runId)}`, class: "mono run-link",
                                     dataset: { runId } }, runId.slice(0, 8));

function question(goal) {
  const g = goal ?? {};
  const model = (m) => m?.identifier ?? "?";
  switch (g.question) {
    case "better": return `Is ${model(g.candidate)} better than ${model(g.baseline)} on ${g.dataset}?`;
    case "cheapest": return `Which of ${(g.models ?? []).map(model).join(", ")} is cheapest at ≥ ${pct(g.min_score)} on ${g.dataset}?`;
    case "regressed": return `Did run ${g.reference_run}'s model regress?`;
    case "helps": return `Does the change help run ${g.reference_run}?`;
    default: return g.question ?? "–";
  }
}

export function sessionsView(root) {
  const body = h("tbody", { id: "sessions-body" });
  const note = h("p", { class: "muted", id: "sessions-note" });
  root.append(h("section", { class: "sessions" },
    h("div", { class: "toolbar" }, h("h1", {}, "Operator sessions")),
    h("table", { class: "grid", id: "sessions-table" },
      h("thead", {}, h("tr", {}, ["Status", "Session", "Question", "Runs", "Cost", "Started", "Answer"]
        .map((c) => h("th", {}, c)))),
      body),
    note));

  function row(s) {
    const href = `#/sessions/${encodeURIComponent(s.id)}`;
    return h("tr", { class: "run-row session-row", dataset: { sessionId: s.id, status: s.status },
                     onclick: (e) => { if (e.target.tagName !== "A") location.hash = href; } },
      h("td", {}, sessionBadge(s.status)),
      h("td", {}, h("a", { href, class: "mono" }, s.id.slice(0, 8))),
      h("td", {}, question(s.goal)),
      h("td", { class: "num" }, String(s.runs.length)),
      h("td", { class: "num" }, usd(s.cost)),
      h("td", {}, when(s.created_at)),
      h("td", { class: "answer-cell" }, s.answer?.sentence ?? ""));
  }

  async function load() {
    const page = await api("/v1/operator/sessions?limit=100");
    body.replaceChildren(...page.sessions.map(row));
    note.textContent = page.sessions.length ? "" : "No sessions yet: ask one with `benchwright ask` or POST /v1/operator/sessions.";
  }
  load().catch((err) => { note.textContent = `Could not load sessions: ${err.message}`; });
  const timer = setInterval(() => { if (!document.hidden) load().catch(() => {}); }, LIST_REFRESH_MS);
  return () => clearInterval(timer);
}

/** One line per event of the session's log. */
function describe(ev) {
  const d = ev.data ?? {};
  switch (ev.type) {
    case "SessionStarted": return `${d.operator}: ${question(d.goal)}`;
    case "OperatorDecision": return `${d.action}: ${d.reason}`;
    case "OperatorRunLaunched": return `run ${d.run_id.slice(0, 8)} launched (${d.label}, ${d.model})`;
    case "OperatorRunRefused": return `launch of ${d.label} refused (${d.code}): ${d.message}`;
    case "OperatorRunRead": {
      const e = d.evidence ?? {};
      return `run ${d.run_id.slice(0, 8)} read (${d.label}): ${e.status}, ${pct(e.pass_rate)} ${ci(e.pass_rate_ci)}`;
    }
    case "OperatorControl": return `${d.action}${d.message ? `: ${d.message}` : ""} (from a person)`;
    case "SessionAnswered": return `${d.status}: ${d.answer?.sentence ?? ""}`;
    default: return JSON.stringify(d);
  }
}

export function sessionView(root, sessionId) {
  const abort = new AbortController();
  const path = `/v1/operator/sessions/${encodeURIComponent(sessionId)}`;
  const s = { session: null, config: null, runs: new Map(), labels: new Map(), stream: "connecting" };
  const el = {
    status: h("span", { id: "session-status" }),
    temporal: h("a", { id: "temporal-link", target: "_blank", rel: "noopener", hidden: true }, "Temporal UI ↗"),
    temporalRuns: h("a", { id: "temporal-runs-link", target: "_blank", rel: "noopener", hidden: true },
      "its runs in Temporal ↗"),
    stream: h("span", { id: "stream-state", class: "muted" }),
    flash: h("p", { id: "flash", class: "error", role: "alert" }),
    goal: h("dl", { id: "session-goal", class: "facts" }),
    budget: h("dl", { id: "session-budget", class: "facts" }),
    runs: h("tbody", { id: "session-runs" }),
    answer: h("section", { id: "answer-card", class: "card", hidden: true }),
    log: h("ol", { id: "decision-log", class: "log session-log" }),
  };
  root.append(h("section", { class: "session" },
    h("div", { class: "run-head" }, h("h1", {}, "Session ", h("span", { class: "mono" }, sessionId)), el.status,
      el.temporal, el.temporalRuns, el.stream),
    el.flash, el.answer,
    h("div", { class: "columns" },
      h("section", { class: "card wide" }, h("h2", {}, "Goal"), el.goal),
      h("section", { class: "card" }, h("h2", {}, "Budget"), el.budget)),
    h("section", { class: "card" }, h("h2", {}, "Runs"),
      h("table", { class: "grid", id: "session-runs-table" },
        h("thead", {}, h("tr", {}, ["Run", "Label", "Model", "Status", "Pass rate", "95 % interval", "Tasks", "Cost"]
          .map((c) => h("th", {}, c)))),
        el.runs)),
    h("section", { class: "card" }, h("h2", {}, "Decisions"), el.log)));

  function render() {
    const ss = s.session;
    if (!ss) return;
    el.status.replaceChildren(sessionBadge(ss.status));
    el.stream.textContent = { live: "● live", reconnecting: "reconnecting…", done: "log closed",
                              connecting: "connecting…" }[s.stream] ?? s.stream;
    el.stream.dataset.state = s.stream;
    const cfg = s.config;
    if (cfg?.temporal_ui_url) {
      const ns = `${cfg.temporal_ui_url}/namespaces/${encodeURIComponent(cfg.temporal_namespace)}`;
      el.temporal.href = `${ns}/workflows/${encodeURIComponent(`operator-${ss.id}`)}`;
      el.temporalRuns.href = `${ns}/workflows?query=${encodeURIComponent(`BenchwrightOperatorSession="${ss.id}"`)}`;
      el.temporal.hidden = el.temporalRuns.hidden = false;
    }
    el.goal.replaceChildren(...[["Question", question(ss.goal)], ["Operator", ss.operator],
      ["Goal", json(ss.goal)], ["Started", when(ss.created_at)], ["Finished", when(ss.finished_at)]]
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", { class: k === "Goal" ? "mono pre" : "",
                                                     dataset: { field: k.toLowerCase() } }, v)]));
    const budget = ss.limits?.session ?? {};
    el.budget.replaceChildren(...[
      ["Runs", `${ss.runs.length} of ${budget.runs ?? 10}`, "runs"],
      ["Cost", budget.cost ? `${usd(ss.cost)} of ${usd(budget.cost)}` : `${usd(ss.cost)} (no cost limit: the balance)`,
        "cost"],
      ["Deadline", budget.deadline ? when(budget.deadline) : "none", "deadline"],
    ].flatMap(([k, v, f]) => [h("dt", {}, k), h("dd", { dataset: { field: f } }, v)]));
    el.runs.replaceChildren(...ss.runs.map((runId) => {
      const run = s.runs.get(runId);
      const sum = run?.tasks?.summary;
      return h("tr", { class: "session-run", dataset: { runId, status: run?.display_status ?? "",
                                                       passRate: sum?.pass_rate ?? "" } },
        h("td", {}, runLink(runId)), h("td", {}, s.labels.get(runId) ?? ""),
        h("td", { class: "mono" }, run?.model?.identifier ?? ""),
        h("td", {}, run ? h("span", { class: `badge status-${run.display_status}` }, run.display_status) : "…"),
        h("td", { class: "num" }, pct(sum?.pass_rate)), h("td", { class: "num" }, ci(sum?.pass_rate_ci)),
        h("td", { class: "num" }, sum ? `${sum.passed + sum.failed + sum.errored}/${sum.total || "?"}` : ""),
        h("td", { class: "num" }, usd(run?.cost?.incurred)));
    }));
    renderAnswer(ss.answer);
  }

  function renderAnswer(answer) {
    if (!answer) { el.answer.hidden = true; return; }
    const rows = answer.evidence.map((e) => h("tr", { class: "evidence-row", dataset: { runId: e.run_id } },
      h("td", {}, runLink(e.run_id)), h("td", {}, e.label), h("td", { class: "mono" }, e.model), h("td", {}, e.status),
      h("td", { class: "num" }, pct(e.pass_rate)), h("td", { class: "num" }, ci(e.pass_rate_ci)),
      h("td", { class: "num" }, String(e.no_answer)), h("td", { class: "num" }, String(e.errored)),
      h("td", { class: "num" }, usd(e.cost))));
    el.answer.replaceChildren(h("h2", {}, "Answer"),
      h("p", { id: "answer-sentence", class: "narration", dataset: { outcome: answer.outcome } }, answer.sentence),
      h("table", { class: "grid", id: "evidence-table" },
        h("thead", {}, h("tr", {}, ["Run", "Label", "Model", "Status", "Pass rate", "95 % interval", "No answer",
          "Errors", "Cost"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows)),
      answer.comparisons.length ? h("ul", { id: "comparisons" }, answer.comparisons.map((c) => h("li", {},
        `${c.b.slice(0, 8)} vs ${c.a.slice(0, 8)}: ${(c.difference * 100).toFixed(1)} points `
        + `[${(c.difference_ci[0] * 100).toFixed(1)}, ${(c.difference_ci[1] * 100).toFixed(1)}], `
        + `paired p = ${c.p_value.toPrecision(3)} over ${c.compared} tasks (${c.verdict})`))) : null,
      answer.unestablished.length ? h("ul", { id: "unestablished" }, answer.unestablished.map((u) =>
        h("li", {}, `Not established: ${u}`))) : null);
    el.answer.hidden = false;
  }

  function onEvents(events) {
    const frag = document.createDocumentFragment();
    for (const ev of events) {
      if (ev.type === "OperatorRunLaunched") s.labels.set(ev.data.run_id, ev.data.label);
      frag.append(h("li", { class: `ev ev-${ev.type}`, value: String(ev.seq), title: json(ev.data),
                            dataset: { seq: String(ev.seq), type: ev.type } },
        h("span", { class: "seq" }, ev.seq), h("span", { class: "time" }, new Date(ms(ev.created_at)).toLocaleTimeString()),
        h("span", { class: "type" }, ev.type), h("span", { class: "text" }, describe(ev))));
    }
    el.log.append(frag);
    el.log.dataset.lastSeq = String(events[events.length - 1].seq);
    refresh();
  }

  // One read of the session and its unfinished runs at a time; a request while one is under way runs after it.
  let busy = null;
  let again = false;
  function refresh() {
    if (busy) { again = true; return busy; }
    busy = (async () => {
      do {
        again = false;
        try {
          s.session = await api(path, { signal: abort.signal });
          await Promise.all(s.session.runs.filter((id) => !s.runs.get(id)?.terminal).map(async (id) => {
            s.runs.set(id, await api(`/v1/runs/${encodeURIComponent(id)}`, { signal: abort.signal }));
          }));
          render();
        } catch (err) {
          if (!abort.signal.aborted) el.flash.textContent = `Could not read the session: ${err.message}`;
        }
      } while (again && !abort.signal.aborted);
      busy = null;
    })();
    return busy;
  }

  async function start() {
    try {
      s.config = await api("/v1/ui/config", { signal: abort.signal });
      await refresh();
      await followSession(sessionId, { signal: abort.signal, onEvents,
        onState: (state) => { s.stream = state; render(); },
        over: async () => ENDED.includes((await api(path, { signal: abort.signal })).status) });
      if (!abort.signal.aborted) await refresh();
    } catch (err) {
      if (!abort.signal.aborted) el.flash.textContent = `Could not load the session: ${err.message}`;
    }
  }

  const timer = setInterval(() => {
    if (!document.hidden && s.session && (!ENDED.includes(s.session.status)
        || [...s.runs.values()].some((r) => !r.terminal))) refresh();
  }, REFRESH_MS);
  start();
  return () => { abort.abort(); clearInterval(timer); };
}
