/**
 * An incremental Server-Sent Events parser for `fetch` bodies.
 *
 * EventSource cannot POST, so the chat stream is read with fetch and parsed here. Comment lines
 * matter too: the node sends `: command_id <id>` first (the id `POST /v1/cancel/{id}` takes).
 * Chunks may split anywhere, even inside a line or a multi-byte character (the caller decodes
 * with a streaming TextDecoder).
 */

export interface SseEvent {
  event: string;
  data: string;
}

export interface SseOutput {
  events: SseEvent[];
  comments: string[];
}

export class SseParser {
  private buffer = "";
  private data: string[] = [];
  private event = "";

  /** Feed decoded text; returns the events and comments completed by it. */
  feed(text: string): SseOutput {
    this.buffer += text;
    const out: SseOutput = { events: [], comments: [] };
    let nl: number;
    while ((nl = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, nl);
      const width = this.buffer.startsWith("\r\n", nl) ? 2 : 1;
      if (this.buffer[nl] === "\r" && width === 1 && nl === this.buffer.length - 1) break; // maybe \r\n split
      this.buffer = this.buffer.slice(nl + width);
      this.line(line, out);
    }
    return out;
  }

  /** The end of the stream: an event without its blank line still counts. */
  end(): SseOutput {
    const out: SseOutput = { events: [], comments: [] };
    if (this.buffer) this.line(this.buffer, out);
    this.buffer = "";
    this.line("", out);
    return out;
  }

  private line(line: string, out: SseOutput): void {
    if (line === "") {
      if (this.data.length) out.events.push({ event: this.event || "message", data: this.data.join("\n") });
      this.data = [];
      this.event = "";
      return;
    }
    if (line.startsWith(":")) {
      out.comments.push(line.slice(1).trimStart());
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
  }
}
