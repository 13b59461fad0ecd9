#include "strata/worker/workload.h"

#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

#include "strata/worker/tokenizer.h"

namespace strata::worker {
namespace {

constexpr std::string_view kMagic = "strata-workload 1";

std::vector<std::string_view> SplitTabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == '\t') {
      out.push_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

Result<std::string> Unescape(std::string_view s, size_t line_no) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size())
      return InvalidArgument("workload line " + std::to_string(line_no) + ": trailing backslash");
    switch (s[i]) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case '\\':
        out += '\\';
        break;
      default:
        return InvalidArgument("workload line " + std::to_string(line_no) + ": unknown escape \\" +
                               std::string(1, s[i]));
    }
  }
  return out;
}

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\\')
      out += "\\\\";
    else
      out += c;
  }
  return out;
}

Result<uint32_t> ParseMaxNew(std::string_view s, size_t line_no) {
  uint32_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 65536) {
    return InvalidArgument("workload line " + std::to_string(line_no) +
                           ": max_new must be 1..65536, got '" + std::string(s) + "'");
  }
  return v;
}

}  // namespace

Result<std::vector<WorkloadItem>> ParseWorkload(std::string_view text) {
  std::vector<WorkloadItem> items;
  size_t line_no = 0;
  bool saw_magic = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    if (!saw_magic) {
      if (line != kMagic) {
        return InvalidArgument("workload: first line must be '" + std::string(kMagic) + "'");
      }
      saw_magic = true;
      continue;
    }
    const std::vector<std::string_view> f = SplitTabs(line);
    WorkloadItem item;
    std::string_view max_new, body;
    if (f[0] == "prompt" && f.size() == 3) {
      max_new = f[1];
      body = f[2];
    } else if (f[0] == "turn" && f.size() == 4 && !f[1].empty()) {
      item.conversation = std::string(f[1]);
      max_new = f[2];
      body = f[3];
    } else {
      return InvalidArgument("workload line " + std::to_string(line_no) +
                             ": expected 'prompt<TAB>max_new<TAB>text' or "
                             "'turn<TAB>conv<TAB>max_new<TAB>text'");
    }
    Result<uint32_t> n = ParseMaxNew(max_new, line_no);
    if (!n.ok()) return n.status();
    item.max_new_tokens = *n;
    Result<std::string> t = Unescape(body, line_no);
    if (!t.ok()) return t.status();
    if (t->empty())
      return InvalidArgument("workload line " + std::to_string(line_no) + ": empty text");
    item.text = std::move(t).value();
    items.push_back(std::move(item));
  }
  if (!saw_magic) return InvalidArgument("workload: empty file");
  return items;
}

Result<std::vector<WorkloadItem>> ReadWorkloadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open workload '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseWorkload(ss.str());
}

std::string FormatWorkload(const std::vector<WorkloadItem>& items) {
  std::string out = std::string(kMagic) + "\n";
  for (const WorkloadItem& item : items) {
    if (item.conversation.empty()) {
      out += "prompt\t" + std::to_string(item.max_new_tokens) + "\t" + Escape(item.text) + "\n";
    } else {
      out += "turn\t" + item.conversation + "\t" + std::to_string(item.max_new_tokens) + "\t" +
             Escape(item.text) + "\n";
    }
  }
  return out;
}

std::vector<WorkloadItem> MakeSampleWorkload(const SampleWorkloadOptions& o) {
  static const char* kWords[] = {"the",    "store",  "cache",  "block",   "prefix", "token",
                                 "worker", "layer",  "window", "expert",  "global", "state",
                                 "replay", "commit", "fetch",  "request", "node",   "lease"};
  uint64_t state = o.seed;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  auto text = [&](uint32_t bytes, const std::string& lead) {
    std::string s = lead;
    while (s.size() < bytes) {
      s += kWords[next() % (sizeof(kWords) / sizeof(kWords[0]))];
      s += (next() % 9 == 0) ? ".\n" : " ";
    }
    s.resize(bytes);
    return s;
  };
  const std::string system = text(o.system_bytes, "System: you are a cache-aware assistant.\n");
  std::vector<WorkloadItem> items;
  for (uint32_t t = 0; t < o.turns; ++t) {
    for (uint32_t c = 0; c < o.conversations; ++c) {
      WorkloadItem item;
      item.conversation = "c" + std::to_string(c);
      item.max_new_tokens = o.max_new_tokens;
      std::string lead = "\nUser ";
      lead.append(std::to_string(c)).append(", turn ").append(std::to_string(t + 1)).append(": ");
      item.text = t == 0 ? system : std::string();
      item.text.append(text(o.turn_bytes, lead));
      items.push_back(std::move(item));
    }
  }
  return items;
}

Status CheckWorkload(const std::vector<WorkloadItem>& items) {
  std::map<std::string, uint64_t> history;  // per conversation: tokens so far
  for (size_t i = 0; i < items.size(); ++i) {
    const WorkloadItem& item = items[i];
    uint64_t prompt = item.text.size();  // one token per byte
    if (!item.conversation.empty()) {
      uint64_t& so_far = history[item.conversation];
      prompt += so_far;
      so_far = prompt + item.max_new_tokens;
    }
    const std::string what =
        "item " + std::to_string(i + 1) +
        (item.conversation.empty() ? std::string() : " (conversation '" + item.conversation + "')");
    if (prompt == 0) return InvalidArgument(what + ": empty prompt");
    if (prompt > kMaxPromptTokens) {
      return InvalidArgument(what + ": its prompt would be " + std::to_string(prompt) +
                             " tokens, above the limit of " + std::to_string(kMaxPromptTokens));
    }
  }
  return Status::Ok();
}

Result<std::vector<WorkloadResult>> RunWorkload(Engine& engine,
                                                const std::vector<WorkloadItem>& items) {
  STRATA_RETURN_IF_ERROR(CheckWorkload(items));
  std::vector<WorkloadResult> results(items.size());
  // Per conversation: its history and the queue of its turns.
  struct Conversation {
    std::vector<uint32_t> history;
    std::vector<size_t> turns;
    size_t next = 0;
    bool busy = false;
  };
  std::map<std::string, Conversation> convs;
  std::vector<size_t> prompts;
  for (size_t i = 0; i < items.size(); ++i) {
    results[i].item = i;
    results[i].conversation = items[i].conversation;
    if (items[i].conversation.empty()) {
      prompts.push_back(i);
    } else {
      Conversation& c = convs[items[i].conversation];
      c.turns.push_back(i);
      results[i].turn = static_cast<uint32_t>(c.turns.size());
    }
  }
  std::map<uint64_t, size_t> running;  // request id -> item
  auto submit = [&](size_t i, std::vector<uint32_t> prompt) -> Status {
    Request r;
    r.id = i;
    r.prompt = std::move(prompt);
    r.max_new_tokens = items[i].max_new_tokens;
    STRATA_RETURN_IF_ERROR(engine.AddRequest(std::move(r)));
    running[i] = i;
    return Status::Ok();
  };
  for (size_t i : prompts) STRATA_RETURN_IF_ERROR(submit(i, ByteTokenizer::Encode(items[i].text)));
  auto submit_turns = [&]() -> Status {
    for (auto& [name, c] : convs) {
      if (c.busy || c.next == c.turns.size()) continue;
      const size_t i = c.turns[c.next++];
      const std::vector<uint32_t> text = ByteTokenizer::Encode(items[i].text);
      c.history.insert(c.history.end(), text.begin(), text.end());
      c.busy = true;
      STRATA_RETURN_IF_ERROR(submit(i, c.history));
    }
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(submit_turns());
  while (!running.empty()) {
    for (StepOutput& out : engine.Step()) {
      if (!out.finished) continue;
      const size_t i = running.at(out.id);
      running.erase(out.id);
      results[i].output = out.output_tokens;
      results[i].stats = out.stats;
      if (!items[i].conversation.empty()) {
        Conversation& c = convs[items[i].conversation];
        c.history.insert(c.history.end(), out.output_tokens.begin(), out.output_tokens.end());
        c.busy = false;
      }
    }
    STRATA_RETURN_IF_ERROR(submit_turns());
  }
  return results;
}

}  // namespace strata::worker
