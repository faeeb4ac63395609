// policyd console: live views over Server-Sent Events. Every page works
// without this file; it only keeps [data-live] parts up to date. The HTML
// it inserts is rendered and escaped by the server's templates.
(function () {
  'use strict';
  var live = document.querySelector('[data-live]');
  var status = document.getElementById('live-status');
  if (!live || !window.EventSource) {
    return;
  }
  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }
  var es = new EventSource(live.getAttribute('data-live'));
  es.addEventListener('open', function () { say('Live.'); });
  es.addEventListener('ready', function () { say('Live.'); });
  es.addEventListener('body', function (e) {
    live.innerHTML = e.data;
    say('Live, updated ' + new Date().toLocaleTimeString() + '.');
  });
  es.addEventListener('row', function (e) {
    var body = live.querySelector('tbody');
    if (!body) {
      return;
    }
    body.insertAdjacentHTML('afterbegin', e.data);
    while (body.rows.length > 500) {
      body.deleteRow(body.rows.length - 1);
    }
    say('Live, last event ' + new Date().toLocaleTimeString() + '.');
  });
  es.addEventListener('problem', function (e) { say('Live view: ' + e.data); });
  es.addEventListener('error', function () {
    if (es.readyState === EventSource.CLOSED) {
      // The node refused the stream: the session ended, or too many are
      // open. Reloading by itself could loop; the reader decides.
      say('Live updates stopped: reload the page (you may need to sign in again).');
      return;
    }
    say('Reconnecting…');
  });
}());
