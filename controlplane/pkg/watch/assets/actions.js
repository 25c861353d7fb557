// The fleet page's actions: a button (class "act", data-action, data-target)
// first asks GET /watch/actions/{action}/preview what the action does to
// its pool's disruption budget (slots used before and after, what waits)
// and whether this session may do it now, shows that in a dialog, and only
// on "Confirm" posts POST /watch/actions/{action} with the session's form
// token in the X-Watch-CSRF header. The server calls the API's own method
// as the logged-in token; the page decides nothing. No innerHTML: every
// text is set with textContent.
(function () {
  "use strict";

  function csrf() {
    var el = document.querySelector('#logout input[name="csrf"]');
    return el ? el.value : "";
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  // dialog is the one confirmation dialog, outside the live part of the
  // page (which the refresh swaps).
  var dialog = null;
  function getDialog() {
    if (dialog) { return dialog; }
    dialog = el("dialog", { id: "confirm", "aria-labelledby": "confirm-title" });
    document.body.appendChild(dialog);
    return dialog;
  }

  function show(req, p) {
    var d = getDialog();
    d.replaceChildren();
    d.dataset.action = p.action;
    d.appendChild(el("h2", { id: "confirm-title" }, p.title));
    d.appendChild(el("p", { id: "confirm-effect" }, p.effect));
    if (p.budget) {
      var b = p.budget;
      var t = el("table", { id: "confirm-budget" });
      var cap = el("caption", {}, "Disruption budget of pool " + p.pool + " (" + b.spec + " of " + b.nodes + " nodes: " + b.budget + (b.budget === 1 ? " slot)" : " slots)"));
      t.appendChild(cap);
      var r1 = el("tr"); r1.appendChild(el("th", {}, "slots used now")); r1.appendChild(el("td", { id: "confirm-before" }, b.before + " of " + b.budget));
      var r2 = el("tr"); r2.appendChild(el("th", {}, "after")); r2.appendChild(el("td", { id: "confirm-after" }, b.after + " of " + b.budget));
      t.appendChild(r1); t.appendChild(r2);
      d.appendChild(t);
    }
    if (p.waits && p.waits.length) {
      var ul = el("ul", { id: "confirm-waits" });
      p.waits.forEach(function (w) { ul.appendChild(el("li", {}, w)); });
      d.appendChild(ul);
    }
    if (!p.allowed) {
      d.appendChild(el("p", { id: "confirm-why", "class": "error", role: "alert" }, p.why));
    }
    var result = el("p", { id: "confirm-result", role: "status" });
    d.appendChild(result);
    var bar = el("div", { "class": "confirm-buttons" });
    var ok = el("button", { type: "button", id: "confirm-ok" }, "Confirm");
    var cancel = el("button", { type: "button", id: "confirm-cancel" }, "Cancel");
    ok.disabled = !p.allowed;
    ok.addEventListener("click", function () { run(req, p, ok, cancel, result); });
    cancel.addEventListener("click", function () { d.close(); });
    bar.appendChild(ok); bar.appendChild(cancel);
    d.appendChild(bar);
    d.showModal();
  }

  function body(btn) {
    var b = { target: btn.dataset.target };
    if (btn.dataset.gpuFrom) {
      var sel = document.getElementById(btn.dataset.gpuFrom);
      b.gpu = sel ? sel.value : "";
    }
    return b;
  }

  function run(req, p, ok, cancel, result) {
    ok.disabled = true;
    result.textContent = "…";
    fetch("/watch/actions/" + encodeURIComponent(p.action), {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: { "Content-Type": "application/json", "X-Watch-CSRF": csrf() },
      body: JSON.stringify(req)
    }).then(function (resp) {
      return resp.json().then(function (j) { return { status: resp.status, j: j }; });
    }).then(function (r) {
      if (r.status === 200) {
        result.className = "done";
        result.textContent = "Done: " + p.title + ".";
        cancel.textContent = "Close";
        document.body.dataset.acted = p.action;
      } else {
        result.className = "error";
        result.textContent = "Refused (" + r.j.code + "): " + r.j.message;
        ok.disabled = false;
      }
    }).catch(function (err) {
      result.className = "error";
      result.textContent = "Failed: " + err.message;
      ok.disabled = false;
    });
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest ? ev.target.closest("button.act") : null;
    if (!btn) { return; }
    ev.preventDefault();
    // The request is fixed when the button is clicked: what is confirmed
    // is what was previewed, even if a live update swaps the page under
    // the dialog.
    var b = body(btn);
    var q = "target=" + encodeURIComponent(b.target);
    if (b.gpu) { q += "&gpu=" + encodeURIComponent(b.gpu); }
    fetch("/watch/actions/" + encodeURIComponent(btn.dataset.action) + "/preview?" + q, { credentials: "same-origin", cache: "no-store" })
      .then(function (resp) {
        return resp.json().then(function (j) {
          if (!resp.ok) { throw new Error(j.message || ("HTTP " + resp.status)); }
          return j;
        });
      })
      .then(function (p) { show(b, p); })
      .catch(function (err) {
        show(b, { action: btn.dataset.action, title: btn.textContent, effect: "", allowed: false, why: "The preview failed: " + err.message });
      });
  });
})();
