// The fleet page's live updates: listen on /watch/events (Server-Sent
// Events, authorised by the page cookie) and, after each change, fetch the
// live part of the page (/watch/fragment, or a node or GPU page's own
// path with ?fragment=1, rendered and escaped on the server) and swap it
// in. No innerHTML: the fragment is parsed by
// DOMParser, whose scripts never run, and the CSP allows no inline script.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var pending = false, running = false;

  function status(text, ok) {
    live.textContent = text;
    live.className = ok ? "live on" : "live off";
  }

  // fragmentURL is the live part of this page: /watch/fragment for the
  // fleet page, the same path with fragment=1 for a node or GPU page.
  function fragmentURL() {
    var path = window.location.pathname, search = window.location.search;
    if (path === "/watch") { return "/watch/fragment" + search; }
    return path + (search ? search + "&" : "?") + "fragment=1";
  }

  function refresh() {
    if (running) { pending = true; return; }
    running = true;
    fetch(fragmentURL(), { credentials: "same-origin", cache: "no-store" })
      .then(function (resp) {
        if (resp.status === 401) { window.location.assign("/watch"); return null; }
        if (!resp.ok) { throw new Error("HTTP " + resp.status); }
        return resp.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.getElementById("fleet");
        var cur = document.getElementById("fleet");
        if (next && cur) {
          // A choice made on the page (the GPU to reset) survives the swap.
          var chosen = {};
          cur.querySelectorAll("select[id]").forEach(function (sel) { chosen[sel.id] = sel.value; });
          cur.replaceWith(document.adoptNode(next));
          Object.keys(chosen).forEach(function (id) {
            var sel = document.getElementById(id);
            if (sel && Array.from(sel.options).some(function (o) { return o.value === chosen[id]; })) { sel.value = chosen[id]; }
          });
        }
        document.body.dataset.updated = String(Date.now());
      })
      .catch(function (err) { status("update failed: " + err.message, false); })
      .finally(function () {
        running = false;
        if (pending) { pending = false; refresh(); }
      });
  }

  var es = new EventSource("/watch/events");
  es.addEventListener("open", function () { status("live", true); refresh(); });
  es.addEventListener("change", function () { refresh(); });
  es.addEventListener("ended", function () { es.close(); window.location.assign("/watch"); });
  es.addEventListener("error", function () { status("reconnecting…", false); });
})();
