export * from "./errors.js";
export * from "./ids.js";
export * from "./canonical.js";
export * from "./cloudevents.js";
export * from "./wire.js";
export * from "./executor.js";
export * from "./client.js";
