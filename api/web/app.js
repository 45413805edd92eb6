// The dashboard's shell: sign-in, the header, and hash routing (#/signin, #/runs, #/runs/<id>, #/benchmarks,
// #/subsets/<id>, #/sessions, #/sessions/<id>).
// Each view is a function (root, params) returning a cleanup function, called when the route changes.

import { api, auth, ApiError } from "./api.js";
import { h } from "./dom.js";
import { runsView } from "./runs.js";
import { runView } from "./run.js";
import { benchmarksView, subsetView } from "./registry.js";
import { sessionsView, sessionView } from "./sessions.js";

const main = document.getElementById("main");
const who = document.getElementById("who");
let cleanup = null;

function signInView(root) {
  const input = h("input", { type: "password", id: "api-key", name: "api-key", autocomplete: "off",
                             placeholder: "bw_…", required: true, size: 48 });
  const error = h("p", { class: "error", role: "alert" });
  // Where this stack keeps its own key (the server says: the embedded stack's dev.json, wherever its data dir is).
  const keyFile = h("span", { id: "key-file" });
  fetch("/v1/ui/signin").then((r) => (r.ok ? r.json() : null)).then((info) => {
    if (info && info.key_file) keyFile.append("; this stack's is in ", h("code", {}, info.key_file));
  }).catch(() => {});
  const form = h("form", { class: "signin", id: "signin-form" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Paste an API key (", h("code", {}, "benchwright accounts create NAME"), " prints one",
      keyFile, "). It is kept in this tab's session storage only."),
    h("label", { for: "api-key" }, "API key"), input,
    h("button", { type: "submit" }, "Sign in"), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    auth.set(input.value.trim());
    try {
      await api("/v1/account");
      location.hash = "#/runs";
    } catch (err) {
      auth.clear();
      error.textContent = err instanceof ApiError && err.status === 401 ? "That key was not accepted." : String(err.message);
    }
  });
  root.append(form);
  input.focus();
  return null;
}

async function showAccount() {
  who.replaceChildren();
  if (!auth.get()) return;
  try {
    const account = await api("/v1/account");
    who.append(h("span", { id: "account-name" }, account.name), " ",
      h("span", { class: "muted" }, `balance $${account.balance_usd.toFixed(2)}`), " ",
      h("button", { class: "link", id: "sign-out", onclick: () => { auth.clear(); location.hash = "#/signin"; } },
        "Sign out"));
  } catch { /* a 401 has already sent us to the sign-in page */ }
}

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  main.replaceChildren();
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean);
  if (!auth.get() || parts[0] === "signin") {
    if (parts[0] !== "signin") { location.hash = "#/signin"; return; }
    who.replaceChildren();
    cleanup = signInView(main);
    return;
  }
  showAccount();
  if (parts[0] === "runs" && parts[1]) cleanup = runView(main, decodeURIComponent(parts[1]));
  else if (parts[0] === "benchmarks") cleanup = benchmarksView(main);
  else if (parts[0] === "subsets" && parts[1]) cleanup = subsetView(main, decodeURIComponent(parts[1]));
  else if (parts[0] === "sessions" && parts[1]) cleanup = sessionView(main, decodeURIComponent(parts[1]));
  else if (parts[0] === "sessions") cleanup = sessionsView(main);
  else cleanup = runsView(main, new URLSearchParams(query));
}

window.addEventListener("hashchange", route);
route();
