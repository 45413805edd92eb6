// Results per group (GET /v1/runs/{id}/breakdown): one bar per group, the pass rate with its 95 % interval
// drawn as a whisker, and a column chooser when the data has several grouping columns. The card stays hidden while
// the data has no grouping column (the API answers by: null) or is not analyzed yet.

import { api } from "./api.js";
import { h, pct } from "./dom.js";

const REFRESH_MS = 5000;

export class Breakdown {
  constructor(runId, { signal }) {
    this.path = `/v1/runs/${encodeURIComponent(runId)}/breakdown`;
    this.signal = signal;
    this.by = null;
    this.last = 0;
    this.timer = null;
    this.shown = "";  // the last answer drawn: a refresh that changes nothing leaves the bars (and a reader's hover) alone
    this.chooser = h("select", { id: "breakdown-by", "aria-label": "group by column" });
    this.chooser.addEventListener("change", () => { this.by = this.chooser.value; this.load(); });
    this.bars = h("div", { id: "breakdown-bars", class: "breakdown" });
    this.note = h("p", { class: "muted", id: "breakdown-note" });
    this.card = h("section", { class: "card", id: "breakdown-card", hidden: true },
      h("div", { class: "breakdown-head" }, h("h2", {}, "Results by group"), this.chooser), this.bars, this.note);
  }

  /** Re-read at most every REFRESH_MS while the run moves; at once when it is over. */
  refresh(terminal) {
    if (this.timer) return;
    const wait = terminal ? 0 : Math.max(0, this.last + REFRESH_MS - Date.now());
    this.timer = setTimeout(() => { this.timer = null; this.load(); }, wait);
  }

  stop() { clearTimeout(this.timer); }

  async load() {
    this.last = Date.now();
    let result;
    try {
      result = await api(this.by ? `${this.path}?by=${encodeURIComponent(this.by)}` : this.path,
                         { signal: this.signal });
    } catch (err) {
      if (!this.signal.aborted) this.note.textContent = `Could not load the breakdown: ${err.message}`;
      return;
    }
    if (result.by === null) { this.card.hidden = true; return; }
    this.render(result);
  }

  render(result) {
    this.by = result.by;
    const answer = JSON.stringify(result);
    if (answer === this.shown && !this.card.hidden) return;
    this.shown = answer;
    const columns = result.candidates.includes(result.by) ? result.candidates : [result.by, ...result.candidates];
    this.chooser.replaceChildren(...columns.map((c) => h("option", { value: c, selected: c === result.by }, c)));
    this.chooser.hidden = columns.length < 2;
    this.bars.replaceChildren(...result.groups.map((g) => this.bar(g)));
    this.bars.dataset.by = result.by;
    this.note.textContent = "Bars: pass rate (errors excluded); whiskers: 95 % Wilson interval." +
      (result.folded ? ` ${result.folded} smaller groups are folded into (other).` : "");
    this.card.hidden = false;
  }

  bar(g) {
    const width = (v) => `${(100 * v).toFixed(2)}%`;
    const track = h("div", { class: "bd-track" });
    // Sizes through the CSSOM: the CSP refuses inline style attributes.
    if (g.pass_rate !== null) {
      const fill = h("div", { class: "bd-fill" });
      fill.style.width = width(g.pass_rate);
      track.append(fill);
    }
    if (g.pass_rate_ci) {
      const [low, high] = g.pass_rate_ci;
      const whisker = h("div", { class: "bd-ci", title: `95 % CI ${pct(low)} – ${pct(high)}` });
      whisker.style.left = width(low);
      whisker.style.width = width(high - low);
      track.append(whisker);
    }
    const ci = g.pass_rate_ci ? ` [${pct(g.pass_rate_ci[0])}, ${pct(g.pass_rate_ci[1])}]` : "";
    return h("div", { class: "bd-row", dataset: { group: g.group, passRate: g.pass_rate ?? "", noAnswer: g.no_answer,
                                                  ciLow: g.pass_rate_ci?.[0] ?? "", ciHigh: g.pass_rate_ci?.[1] ?? "" } },
      h("span", { class: "bd-label", title: g.group }, g.group),
      track,
      h("span", { class: "bd-value" }, `${pct(g.pass_rate)}${ci}`),
      h("span", { class: "bd-counts muted" }, `n=${g.total} · ${g.passed} passed, ${g.failed} failed` +
        (g.no_answer ? ` (${g.no_answer} no answer)` : "") + (g.errored ? `, ${g.errored} errored` : "")));
  }
}
