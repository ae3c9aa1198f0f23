/**
 * Images attached to a chat turn for a model with the `vision` capability (docs/vision.md).
 *
 * They travel as OpenAI `image_url` parts with data URLs, so nothing but the chat request carries
 * them. The node bounds each image (`[plugins.api-control] images_max_bytes`, 20 MiB unless the
 * operator changed it) and answers a 413 that says so; the page checks the default bound first so
 * the common mistake is caught before a large upload, and shows the node's own message otherwise.
 */

export interface ChatImage {
  name: string;
  /** `data:<mime>;base64,...` */
  url: string;
  bytes: number;
}

/** The node's default `images_max_bytes`; a node configured lower still answers its own 413. */
export const IMAGE_MAX_BYTES = 20 * 1024 * 1024;
export const IMAGES_PER_MESSAGE = 16;

export function hasVision(capabilities: readonly string[] | undefined): boolean {
  return capabilities?.includes("vision") ?? false;
}

/** Why a file cannot be attached, or null when it can. */
export function imageProblem(file: { name: string; type: string; size: number }, attached: number): string | null {
  if (!file.type.startsWith("image/")) return `${file.name || "the file"} is not an image (${file.type || "unknown type"})`;
  if (file.size > IMAGE_MAX_BYTES) {
    return `${file.name || "the image"} is ${formatMiB(file.size)}; images of at most ${formatMiB(IMAGE_MAX_BYTES)} are taken: scale it down`;
  }
  if (attached >= IMAGES_PER_MESSAGE) return `at most ${IMAGES_PER_MESSAGE} images go with one message`;
  return null;
}

function formatMiB(n: number): string {
  return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
}

export type ContentPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } };

/** A user turn's content: plain text, or text and `image_url` parts when images go with it. */
export function userContent(text: string, images: readonly string[] | undefined): string | ContentPart[] {
  if (!images?.length) return text;
  return [
    ...(text ? [{ type: "text" as const, text }] : []),
    ...images.map((url) => ({ type: "image_url" as const, image_url: { url } })),
  ];
}

/** A file read as a data URL (the browser's FileReader; rejected when it cannot be read). */
export function readImage(file: File): Promise<ChatImage> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve({ name: file.name, url: String(reader.result), bytes: file.size });
    reader.onerror = () => reject(reader.error ?? new Error(`cannot read ${file.name}`));
    reader.readAsDataURL(file);
  });
}
