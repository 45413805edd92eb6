// The phase timeline (from PipelineStarted's plan and the Phase* events) and the live event log's one-line text.

import { duration, h, ms } from "./dom.js";

/** Phase state folded from the event log: each phase's plan, invocations (one per PhaseStarted) and outcome. */
export class Phases {
  constructor() {
    this.order = [];
    this.byName = new Map();
    this.start = null;
    this.end = null;
  }

  phase(name) {
    if (!this.byName.has(name)) {
      this.byName.set(name, { name, state: "planned", skip: null, invocations: [] });
      this.order.push(name);
    }
    return this.byName.get(name);
  }

  /** Fold one event in; returns true when the timeline changed. */
  apply(event) {
    const t = ms(event.created_at);
    const d = event.data;
    switch (event.type) {
      case "RunLaunched": this.start = t; return true;
      case "PipelineStarted":
        for (const p of d.phases ?? []) this.phase(p.phase).skip = p.skip_reason ?? null;
        return true;
      case "PhaseStarted": {
        const p = this.phase(d.phase);
        p.state = "running";
        p.invocations.push({ start: t, end: null, state: "running" });
        return true;
      }
      case "PhaseCompleted": return this.close(d.phase, t, "completed", d.duration_ms);
      case "PhaseFailed": return this.close(d.phase, t, "failed");
      case "PhaseRestartRequested": return this.close(d.phase, t, "restarted");
      case "PhaseSkipped": this.phase(d.phase).state = "skipped"; this.phase(d.phase).skip = d.reason; return true;
      case "PipelineFinished": this.end = t; return true;
      default: return false;
    }
  }

  close(name, t, state, durationMs) {
    const p = this.phase(name);
    const open = p.invocations.at(-1);
    if (open && open.end === null) {
      open.end = t;
      open.state = state;
      if (durationMs !== undefined) open.durationMs = durationMs;
    }
    p.state = state;
    return true;
  }

  /** Materialize is in flight: its latest invocation started and has not closed. */
  get materializeOpen() {
    const open = this.byName.get("materialize")?.invocations.at(-1);
    return Boolean(open && open.end === null);
  }

  render(root, now) {
    const start = this.start ?? now;
    const end = this.end ?? now;
    const span = Math.max(end - start, 1);
    const rows = this.order.map((name) => {
      const p = this.byName.get(name);
      const total = p.invocations.reduce((sum, inv) => sum + (inv.durationMs ?? ((inv.end ?? end) - inv.start)), 0);
      const bars = p.invocations.map((inv, i) => {
        const bar = h("span", { class: `bar bar-${inv.state}`,
          title: `${name} invocation ${i + 1}: ${inv.state}, ${duration((inv.end ?? end) - inv.start)}` });
        // Through the CSSOM: the CSP refuses inline style attributes.
        bar.style.left = `${(100 * (inv.start - start)) / span}%`;
        bar.style.width = `${Math.max((100 * ((inv.end ?? end) - inv.start)) / span, 0.4)}%`;
        return bar;
      });
      return h("tr", { class: `phase phase-${p.state}`, dataset: { phase: name, state: p.state,
                                                                   invocations: String(p.invocations.length) } },
        h("td", { class: "phase-name" }, name),
        h("td", {}, h("span", { class: `pill pill-${p.state}` }, p.state)),
        h("td", { class: "num", title: "invocations (PhaseStarted count)" }, p.invocations.length || "–"),
        h("td", { class: "num" }, p.invocations.length ? duration(total) : (p.skip ?? "–")),
        h("td", { class: "track" }, bars));
    });
    root.replaceChildren(h("table", { class: "timeline" },
      h("thead", {}, h("tr", {}, ["Phase", "State", "Inv.", "Duration", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)));
  }
}

const short = (value, n = 140) => {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
};

/** One line a person can read for an event; the full data is in its tooltip. */
export function describe(event) {
  const d = event.data;
  switch (event.type) {
    case "PhaseStarted": return d.phase;
    case "PhaseCompleted": return `${d.phase} in ${duration(d.duration_ms)}`;
    case "PhaseFailed": return `${d.phase}: ${d.error_type}: ${short(d.detail)}`;
    case "PhaseSkipped": return `${d.phase}: ${d.reason}`;
    case "MaterializeTaskAggregated": return `task ${d.index}: ${d.outcome} (score ${d.score ?? "–"})`;
    case "MaterializeTaskResult": return `task ${d.index} trial ${d.trial}: ${d.outcome}${d.error ? ` – ${short(d.error, 80)}` : ""}`;
    case "AgentTextEvent": return short(d.text);
    case "RunHalted": return d.halt_reason;
    case "RunResumed": return `after ${d.previous_reason}`;
    case "HumanReviewRequested": return `${d.phase}: ${short(d.reason)}`;
    case "PipelineFinished": return `${d.status}${d.halted ? ` (halted: ${d.halt_reason})` : ""}${d.error ? ` – ${short(d.error)}` : ""}`;
    case "SandboxCreated": return `${d.role} ${d.backend} ${d.instance_size}`;
    case "SandboxKilled": return `${d.role} after ${duration(d.duration_ms)}`;
    default: return short(d);
  }
}
