// The fleet page's shell: an xterm.js terminal (assets/xterm, @xterm/xterm
// as published) on a node, through the same tunnel and authorisation as
// `better-compute nodes shell`. POST /watch/actions/shell (the session's
// form token in X-Watch-CSRF) calls tunnels.create as the logged-in token
// and returns the one-use ticket's path; the WebSocket on it carries
// session.proto's TunnelFrame messages, one binary message each, encoded
// and decoded here (only the fields a shell uses). Closing the tab closes
// the WebSocket, and with it the tunnel.
//
// The page's Content-Security-Policy allows styles from the origin, or a
// <style> element carrying this response's nonce. xterm.js makes <style>
// elements of its own: the nonce (on the xterm stylesheet's link, which
// the server rendered) is set on each as it is created, before it is
// attached. The renderer also sets a cell's true colours with
// setAttribute("style", ...), which the policy refuses; those go through
// the CSSOM (element.style.cssText), which it allows.
(function () {
  "use strict";
  var term_el = document.getElementById("terminal");
  var live = document.getElementById("live");
  if (!term_el) { if (live) { live.textContent = "no shell"; } return; }
  var link = document.getElementById("xterm-css");
  var nonce = link ? link.nonce : "";

  var createElement = Document.prototype.createElement;
  Document.prototype.createElement = function (tag, opts) {
    var e = createElement.call(this, tag, opts);
    if (String(tag).toLowerCase() === "style" && nonce) { e.setAttribute("nonce", nonce); }
    return e;
  };
  var setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === "style" && this.style) { this.style.cssText = String(value); return; }
    return setAttribute.call(this, name, value);
  };

  function status(text, ok) {
    live.textContent = text;
    live.className = ok ? "live on" : "live off";
  }

  // Protocol buffers, as much as TunnelFrame needs.
  var enc = new TextEncoder(), dec = new TextDecoder();
  function varint(n, out) {
    while (n > 127) { out.push((n & 127) | 128); n = Math.floor(n / 128); }
    out.push(n);
  }
  function field(num, bytes, out) {
    varint(num * 8 + 2, out);
    varint(bytes.length, out);
    for (var i = 0; i < bytes.length; i++) { out.push(bytes[i]); }
  }
  function dataFrame(bytes) { var out = []; field(10, bytes, out); return new Uint8Array(out); }
  function resizeFrame(rows, cols) {
    var inner = []; varint(8, inner); varint(rows, inner); varint(16, inner); varint(cols, inner);
    var out = []; field(11, inner, out); return new Uint8Array(out);
  }
  function readVarint(b, pos) {
    var n = 0, mul = 1, c;
    do { c = b[pos.i++]; n += (c & 127) * mul; mul *= 128; } while (c & 128);
    return n;
  }
  // parse returns the frame's fields by number: bytes for length-delimited
  // ones, numbers for varints.
  function parse(b) {
    var pos = { i: 0 }, f = {};
    while (pos.i < b.length) {
      var key = readVarint(b, pos), num = Math.floor(key / 8), wt = key & 7;
      if (wt === 0) { f[num] = readVarint(b, pos); }
      else if (wt === 2) { var len = readVarint(b, pos); f[num] = b.subarray(pos.i, pos.i + len); pos.i += len; }
      else if (wt === 5) { pos.i += 4; }
      else if (wt === 1) { pos.i += 8; }
      else { throw new Error("bad frame"); }
    }
    return f;
  }

  var term = new Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
  term.open(term_el);
  window.bcTerminal = term;
  var node = term_el.dataset.node;
  var csrf = document.querySelector('#logout input[name="csrf"]').value;
  status("opening…", false);

  fetch("/watch/actions/shell", {
    method: "POST", credentials: "same-origin", cache: "no-store",
    headers: { "Content-Type": "application/json", "X-Watch-CSRF": csrf },
    body: JSON.stringify({ target: node })
  }).then(function (resp) {
    return resp.json().then(function (j) {
      if (!resp.ok) { throw new Error(j.code + ": " + j.message); }
      return j;
    });
  }).then(function (j) {
    var proto = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + window.location.host + j.path + "?rows=" + term.rows + "&cols=" + term.cols + "&term=xterm-256color");
    ws.binaryType = "arraybuffer";
    ws.addEventListener("open", function () {
      status("connected", true);
      document.body.dataset.shell = "open";
      term.focus();
    });
    ws.addEventListener("message", function (ev) {
      var f = parse(new Uint8Array(ev.data));
      if (f[10]) { term.write(f[10]); }
      if (f[14] !== undefined) {
        var x = parse(f[14]);
        var code = x[1] === undefined ? 0 : x[1];
        if (code > 2147483647) { code = -1; }
        var sig = x[2] ? dec.decode(x[2]) : "";
        term.write("\r\n[the shell ended: " + (sig ? "signal " + sig : "exit status " + code) + "]\r\n");
        document.body.dataset.shell = "exited";
      }
      if (f[15]) { term.write("\r\n[" + dec.decode(f[15]) + "]\r\n"); }
    });
    ws.addEventListener("close", function (ev) {
      status("closed" + (ev.reason ? ": " + ev.reason : ""), false);
      document.body.dataset.shell = "closed";
    });
    term.onData(function (s) {
      if (ws.readyState === WebSocket.OPEN) { ws.send(dataFrame(enc.encode(s))); }
    });
    term.onResize(function (size) {
      if (ws.readyState === WebSocket.OPEN) { ws.send(resizeFrame(size.rows, size.cols)); }
    });
  }).catch(function (err) {
    status("refused", false);
    term.write("[" + err.message + "]\r\n");
    document.body.dataset.shell = "refused";
  });
})();
