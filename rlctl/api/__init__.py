"""The OpenAI-compatible API that `rlctl serve` and the agent endpoint share: the wire format
(protocol), tool calls, images, errors and the HTTP front (http.OpenAIServer) over any engine that
takes rlctl.api.requests.Request objects."""
