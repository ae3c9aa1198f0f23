import { describe, expect, it } from "vitest";
import { requestMessages } from "../src/logic/chat";
import { hasVision, IMAGE_MAX_BYTES, imageProblem, userContent } from "../src/logic/images";

describe("chat images", () => {
  it("sends images as image_url parts after the text, plain text otherwise", () => {
    expect(userContent("hi", [])).toBe("hi");
    expect(userContent("what is it", ["data:image/png;base64,AAA"])).toEqual([
      { type: "text", text: "what is it" },
      { type: "image_url", image_url: { url: "data:image/png;base64,AAA" } },
    ]);
    expect(userContent("", ["data:x"])).toEqual([{ type: "image_url", image_url: { url: "data:x" } }]);
    const sent = requestMessages([{ role: "user", content: "a", images: ["data:y"] }, { role: "assistant", content: "b" }]);
    expect(sent[0]!.content).toHaveLength(2);
    expect(sent[1]!.content).toBe("b");
  });
  it("says why a file is refused", () => {
    expect(hasVision(["text", "vision"])).toBe(true);
    expect(hasVision(["text"])).toBe(false);
    expect(imageProblem({ name: "a.txt", type: "text/plain", size: 3 }, 0)).toMatch(/not an image/);
    expect(imageProblem({ name: "big.png", type: "image/png", size: IMAGE_MAX_BYTES + 1 }, 0)).toMatch(/at most 20.0 MiB/);
    expect(imageProblem({ name: "a.png", type: "image/png", size: 10 }, 16)).toMatch(/at most 16/);
    expect(imageProblem({ name: "a.png", type: "image/png", size: 10 }, 0)).toBeNull();
  });
});
