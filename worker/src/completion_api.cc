#include "strata/worker/completion_api.h"

#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>

namespace strata::worker {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool Fault(ApiError* error, std::string param, std::string message, int status = 400) {
  error->status = status;
  error->param = std::move(param);
  error->message = error->param.empty() ? std::move(message) : error->param + ": " + message;
  return false;
}

bool ParsePrompt(const Json& value, const CompletionLimits& limits, CompletionRequest* out,
                 ApiError* error) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() > limits.max_prompt_tokens) {
      return Fault(error, "prompt",
                   std::to_string(text.size()) + " tokens is past the limit of " +
                       std::to_string(limits.max_prompt_tokens));
    }
    out->prompt.assign(text.begin(), text.end());
    for (uint32_t& t : out->prompt) t &= 0xff;  // bytes, whatever char's sign
  } else if (value.is_array()) {
    if (value.size() > limits.max_prompt_tokens) {
      return Fault(error, "prompt",
                   std::to_string(value.size()) + " tokens is past the limit of " +
                       std::to_string(limits.max_prompt_tokens));
    }
    out->prompt.reserve(value.size());
    for (const Json& id : value) {
      if (id.is_string() || id.is_array()) {
        return Fault(error, "prompt", "one prompt per request: a string or an array of token ids");
      }
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(limits.vocab)) {
        return Fault(
            error, "prompt",
            "token ids are integers in [0, " + std::to_string(limits.vocab) + "); got " + Dump(id));
      }
      out->prompt.push_back(id.get<uint32_t>());
    }
  } else {
    return Fault(error, "prompt", "must be a string or an array of token ids");
  }
  if (out->prompt.empty()) return Fault(error, "prompt", "is empty");
  return true;
}

bool ParseMaxTokens(const Json& value, const CompletionLimits& limits, CompletionRequest* out,
                    ApiError* error) {
  if (!value.is_number_integer()) return Fault(error, "max_tokens", "must be an integer");
  if (value.is_number_unsigned() ? value.get<uint64_t>() == 0 : value.get<int64_t>() <= 0) {
    return Fault(error, "max_tokens", "must be at least 1");
  }
  if (value.get<uint64_t>() > limits.max_tokens) {
    return Fault(
        error, "max_tokens",
        Dump(value) + " is past the model's limit of " + std::to_string(limits.max_tokens));
  }
  out->max_tokens = value.get<uint32_t>();
  return true;
}

bool ParseSampling(const Json& body, CompletionRequest* out, ApiError* error) {
  if (auto t = body.find("temperature"); t != body.end() && !t->is_null()) {
    if (!t->is_number()) return Fault(error, "temperature", "must be a number");
    const double v = t->get<double>();
    if (!std::isfinite(v) || v < 0 || v > 2) {
      return Fault(error, "temperature", "must be in [0, 2]");
    }
    out->sampling.temperature = static_cast<float>(v);
  }
  if (auto s = body.find("seed"); s != body.end() && !s->is_null()) {
    if (!s->is_number_integer()) return Fault(error, "seed", "must be an integer");
    out->sampling.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  return true;
}

bool ParseStreaming(const Json& body, CompletionRequest* out, ApiError* error) {
  if (auto s = body.find("stream"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) return Fault(error, "stream", "must be true or false");
    out->stream = s->get<bool>();
  }
  if (auto o = body.find("stream_options"); o != body.end() && !o->is_null()) {
    if (!o->is_object()) return Fault(error, "stream_options", "must be an object");
    if (auto u = o->find("include_usage"); u != o->end() && !u->is_null()) {
      if (!u->is_boolean()) {
        return Fault(error, "stream_options.include_usage", "must be true or false");
      }
      out->include_usage = u->get<bool>();
    }
  }
  return true;
}

bool ParseStrings(const Json& body, const CompletionLimits& limits, CompletionRequest* out,
                  ApiError* error) {
  for (const char* field : {"model", "session_id", "user"}) {
    auto v = body.find(field);
    if (v == body.end() || v->is_null()) continue;
    if (!v->is_string()) return Fault(error, field, "must be a string");
    const std::string& s = v->get_ref<const std::string&>();
    if (s.size() > limits.max_session_id_bytes) {
      return Fault(error, field,
                   "is longer than " + std::to_string(limits.max_session_id_bytes) + " bytes");
    }
    if (std::string_view(field) == "model") out->model = s;
    if (std::string_view(field) == "session_id") out->session_id = s;
  }
  if (auto n = body.find("n"); n != body.end() && !n->is_null()) {
    if (!n->is_number_integer() || n->get<int64_t>() != 1) {
      return Fault(error, "n", "only n = 1 is served");
    }
  }
  return true;
}

bool ParseBody(const Json& body, const CompletionLimits& limits, CompletionRequest* out,
               ApiError* error) {
  if (!body.is_object()) return Fault(error, "", "the body must be a JSON object");
  auto prompt = body.find("prompt");
  if (prompt == body.end()) return Fault(error, "prompt", "is required");
  if (!ParsePrompt(*prompt, limits, out, error)) return false;
  if (auto m = body.find("max_tokens"); m != body.end() && !m->is_null()) {
    if (!ParseMaxTokens(*m, limits, out, error)) return false;
  }
  return ParseSampling(body, out, error) && ParseStreaming(body, out, error) &&
         ParseStrings(body, limits, out, error);
}

Json UsageObject(const RequestStats& stats, size_t completion_tokens) {
  return {{"prompt_tokens", stats.prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", stats.prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", stats.hit_tokens}}},
          {"strata",
           {{"hbm_hit_tokens", stats.hbm_hit_tokens},
            {"store_hit_tokens", stats.hit_tokens - stats.hbm_hit_tokens},
            {"store_ssd_hit_tokens", stats.ssd_hit_tokens},
            {"replayed_tokens", stats.replayed_tokens},
            {"computed_tokens", stats.computed_tokens},
            {"recomputed_tokens", stats.recomputed_tokens},
            {"swa_hit", stats.swa_hit},
            {"ttft_ms", stats.ttft_s * 1e3}}}};
}

Json Chunk(const CompletionIdentity& who, Json choices) {
  return {{"id", who.id},
          {"object", "text_completion"},
          {"created", who.created},
          {"model", who.model},
          {"choices", std::move(choices)}};
}

}  // namespace

std::optional<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                        const CompletionLimits& limits,
                                                        ApiError* error) {
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    Fault(error, "", "the body is not valid JSON");
    return std::nullopt;
  }
  CompletionRequest out;
  try {
    if (!ParseBody(parsed, limits, &out, error)) return std::nullopt;
  } catch (const std::exception& e) {  // a number out of its type's range
    Fault(error, "", std::string("malformed request: ") + e.what());
    return std::nullopt;
  }
  return out;
}

std::string ErrorJson(const ApiError& error) {
  Json e = {{"message", error.message},
            {"type", error.status >= 500 ? "server_error" : "invalid_request_error"},
            {"param", error.param.empty() ? Json(nullptr) : Json(error.param)},
            {"code", error.status}};
  return Dump(Json{{"error", std::move(e)}}) + "\n";
}

std::string Utf8Decoder::Push(uint8_t b) {
  if (!pending_.empty()) {
    if (Continues(b)) {
      pending_ += static_cast<char>(b);
      if (pending_.size() < need_) return {};
      return std::exchange(pending_, {});
    }
    pending_.clear();
    return kReplacement + Push(b);
  }
  if (b < 0x80) return std::string(1, static_cast<char>(b));
  if (b >= 0xC2 && b <= 0xF4) {
    need_ = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    pending_ = std::string(1, static_cast<char>(b));
    return {};
  }
  return kReplacement;
}

std::string Utf8Decoder::Flush() { return std::exchange(pending_, {}).empty() ? "" : kReplacement; }

// RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF.
bool Utf8Decoder::Continues(uint8_t b) const {
  if (b < 0x80 || b > 0xBF) return false;
  if (pending_.size() != 1) return true;
  switch (static_cast<uint8_t>(pending_[0])) {
    case 0xE0:
      return b >= 0xA0;
    case 0xED:
      return b <= 0x9F;
    case 0xF0:
      return b >= 0x90;
    case 0xF4:
      return b <= 0x8F;
    default:
      return true;
  }
}

std::string TokensToText(const std::vector<uint32_t>& tokens) {
  Utf8Decoder decoder;
  std::string text;
  for (uint32_t t : tokens) text += decoder.Push(static_cast<uint8_t>(t));
  return text + decoder.Flush();
}

std::string UsageJson(const RequestStats& stats, size_t completion_tokens) {
  return Dump(UsageObject(stats, completion_tokens));
}

std::string CompletionJson(const CompletionIdentity& who, const std::vector<uint32_t>& output,
                           const RequestStats& stats) {
  Json choice = {{"index", 0},
                 {"text", TokensToText(output)},
                 {"token_ids", output},
                 {"logprobs", nullptr},
                 {"finish_reason", "length"}};
  Json j = Chunk(who, Json::array({std::move(choice)}));
  j["usage"] = UsageObject(stats, output.size());
  return Dump(j) + "\n";
}

}  // namespace strata::worker

namespace strata::worker {

std::string TokenEvent(const CompletionIdentity& who, uint32_t token, std::string_view text,
                       bool last) {
  Json choice = {{"index", 0},
                 {"text", text},
                 {"token_ids", {token}},
                 {"logprobs", nullptr},
                 {"finish_reason", last ? Json("length") : Json(nullptr)}};
  return "data: " + Dump(Chunk(who, Json::array({std::move(choice)}))) + "\n\n";
}

std::string UsageEvent(const CompletionIdentity& who, const RequestStats& stats,
                       size_t completion_tokens) {
  Json j = Chunk(who, Json::array());
  j["usage"] = UsageObject(stats, completion_tokens);
  return "data: " + Dump(j) + "\n\n";
}

std::string ErrorEvent(const ApiError& error) {
  std::string body = ErrorJson(error);
  body.pop_back();  // its newline
  return "data: " + body + "\n\n";
}

std::string ModelsJson(const std::string& model, const std::string& fingerprint, int64_t created) {
  Json m = {{"id", model},
            {"object", "model"},
            {"created", created},
            {"owned_by", "strata"},
            {"fingerprint", fingerprint}};
  return Dump(Json{{"object", "list"}, {"data", Json::array({std::move(m)})}}) + "\n";
}

}  // namespace strata::worker
