// Package oaiformat owns Switchyard's reading and writing of the OpenAI
// request and chunk format, so that one package, not six, decides what a
// body means and what an engine receives.
//
// It reads a client's request into the facts the broker needs ([Read]:
// model, stream, n, include_usage, tools, why the PD pipeline or a
// migration cannot serve it) and refuses the hand-off fields that belong to
// Switchyard's PD pipeline ([HandoffFields]). It builds the bodies engines
// receive: the agent's streaming body ([StreamingBody]), the PD legs
// ([VLLMPrefillBody], [VLLMDecodeBody], [SGLangBody]) and a migrated
// attempt's continuation ([Continuation]). Each engine body copies the
// client's members as they were written ([Rewrite]), walked by the
// jsonscan subpackage on encoding/json; no body is decoded and encoded
// again. It rewrites the chunks of a migrated stream ([RewriteChunk]),
// reads the fields the agent needs from an engine's chunk with
// encoding/json ([ReadChunk]), and holds the helpers several adapters
// shared copies of: stop lists ([Stops]) and a JSON string appender
// ([AppendString]).
//
// Keys: engines (Python's json, pydantic) match keys exactly after
// unescaping, so the rewrites compare keys exactly, and a body with an
// escaped key goes through encoding/json to compare keys as the engine
// will read them. [Read] decodes a body with encoding/json, but for
// member names, which it too matches exactly: a member spelled in another
// case is not the engine's either.
package oaiformat
