// The pure parts of object-storage I/O: URLs, settings resolution, the retry policy.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "io/object_store.h"
#include "stoker/frontend/environment.h"

namespace stoker::io {

ObjectUrl parse_object_url(std::string_view url) {
  ObjectUrl out;
  out.url = std::string(url);
  if (url.starts_with("s3://")) {
    out.scheme = ObjectUrl::Scheme::kS3;
    std::string_view rest = url.substr(5);
    std::size_t slash = rest.find('/');
    out.bucket = std::string(rest.substr(0, slash));
    if (slash != std::string_view::npos) out.key = std::string(rest.substr(slash + 1));
    if (out.bucket.empty()) {
      throw std::invalid_argument("object URL '" + out.url + "': no bucket (s3://BUCKET/KEY)");
    }
    return out;
  }
  if (url.starts_with("http://") || url.starts_with("https://")) {
    std::size_t host = url.find("://") + 3;
    if (host >= url.size() || url[host] == '/') {
      throw std::invalid_argument("object URL '" + out.url + "': no host");
    }
    return out;
  }
  throw std::invalid_argument("object URL '" + out.url +
                              "': not s3://BUCKET/KEY, http:// or https://");
}

namespace {

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

using Section = std::map<std::string, std::string>;

// INI as the AWS tools write it: "[section]", "key = value", comments from '#' or ';' at a
// line's start. Indented lines (nested "s3 =" settings) are skipped.
std::map<std::string, Section> parse_ini(std::string_view text) {
  std::map<std::string, Section> sections;
  Section* current = nullptr;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    bool indented = !raw.empty() && (raw.front() == ' ' || raw.front() == '\t');
    std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = &sections[std::string(trim(line.substr(1, line.size() - 2)))];
      continue;
    }
    std::size_t eq = line.find('=');
    if (current == nullptr || indented || eq == std::string_view::npos) continue;
    (*current)[std::string(trim(line.substr(0, eq)))] = std::string(trim(line.substr(eq + 1)));
  }
  return sections;
}

const std::string* find(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() || it->second.empty() ? nullptr : &it->second;
}

}  // namespace

S3Settings resolve_s3_settings(const std::map<std::string, std::string>& env,
                               std::string_view credentials_file, std::string_view config_file,
                               const S3Overrides& overrides) {
  S3Settings s;
  bool named = false;
  if (overrides.profile) {
    s.profile = *overrides.profile;
    named = true;
  } else if (const std::string* p = find(env, "AWS_PROFILE")) {
    s.profile = *p;
    named = true;
  }
  auto credentials = parse_ini(credentials_file);
  auto config = parse_ini(config_file);
  const Section* cred_section = nullptr;
  const Section* config_section = nullptr;
  if (auto it = credentials.find(s.profile); it != credentials.end()) cred_section = &it->second;
  std::string config_name = s.profile == "default" ? "default" : "profile " + s.profile;
  if (auto it = config.find(config_name); it != config.end()) config_section = &it->second;
  if (named && cred_section == nullptr && config_section == nullptr) {
    throw std::invalid_argument("AWS profile '" + s.profile +
                                "' is in neither the shared credentials nor the config file");
  }
  static const Section kEmpty;
  const Section& cred = cred_section ? *cred_section : kEmpty;
  const Section& conf = config_section ? *config_section : kEmpty;

  // Keys: a pair from one place (an override of either replaces that one).
  const std::string* env_id = find(env, "AWS_ACCESS_KEY_ID");
  const std::string* env_secret = find(env, "AWS_SECRET_ACCESS_KEY");
  if (env_id && env_secret) {
    s.access_key_id = *env_id;
    s.secret_access_key = *env_secret;
    if (const std::string* t = find(env, "AWS_SESSION_TOKEN")) s.session_token = *t;
  } else {
    for (const Section* section : {&cred, &conf}) {
      const std::string* id = find(*section, "aws_access_key_id");
      const std::string* secret = find(*section, "aws_secret_access_key");
      if (id && secret) {
        s.access_key_id = *id;
        s.secret_access_key = *secret;
        if (const std::string* t = find(*section, "aws_session_token")) s.session_token = *t;
        break;
      }
    }
  }
  if (overrides.access_key_id) s.access_key_id = *overrides.access_key_id;
  if (overrides.secret_access_key) s.secret_access_key = *overrides.secret_access_key;
  if (overrides.session_token) s.session_token = *overrides.session_token;
  if (s.access_key_id.empty() != s.secret_access_key.empty()) {
    throw std::invalid_argument(
        "S3 credentials: an access key id without a secret access key, or the reverse");
  }

  if (overrides.region) {
    s.region = *overrides.region;
  } else if (const std::string* r = find(env, "AWS_REGION")) {
    s.region = *r;
  } else if (const std::string* d = find(env, "AWS_DEFAULT_REGION")) {
    s.region = *d;
  } else if (const std::string* c = find(conf, "region")) {
    s.region = *c;
  }

  if (overrides.endpoint) {
    s.endpoint = *overrides.endpoint;
  } else if (const std::string* e = find(env, "AWS_ENDPOINT_URL_S3")) {
    s.endpoint = *e;
  } else if (const std::string* g = find(env, "AWS_ENDPOINT_URL")) {
    s.endpoint = *g;
  } else if (const std::string* c = find(conf, "endpoint_url")) {
    s.endpoint = *c;
  }
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  return s;
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

S3Settings load_s3_settings(const S3Overrides& overrides) {
  const std::map<std::string, std::string> env =
      detail::env_vars([](std::string_view name) { return name.starts_with("AWS_"); });
  const std::string home = detail::env_var("HOME").value_or("");
  auto file = [&](const char* var, const char* name) {
    if (const std::string* p = find(env, var)) return *p;
    return home.empty() ? std::string() : home + "/.aws/" + name;
  };
  std::string credentials_path = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  std::string config_path = file("AWS_CONFIG_FILE", "config");
  return resolve_s3_settings(env, credentials_path.empty() ? "" : read_text(credentials_path),
                             config_path.empty() ? "" : read_text(config_path), overrides);
}

ProxySettings resolve_proxy_settings(const std::map<std::string, std::string>& env) {
  auto first = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (const std::string* v = find(env, name)) return *v;
    }
    return std::string();
  };
  ProxySettings out;
  out.http = first({"http_proxy", "all_proxy", "ALL_PROXY"});  // not HTTP_PROXY (CGI's Proxy:)
  out.https = first({"https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"});
  out.no_proxy = first({"no_proxy", "NO_PROXY"});
  return out;
}

ProxySettings load_proxy_settings() {
  return resolve_proxy_settings(detail::env_vars([](std::string_view name) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.ends_with("_proxy");
  }));
}

double retry_delay(const RetryPolicy& policy, int retry, double uniform01) {
  if (retry < 1) return 0;
  double cap = policy.base_delay_s * std::ldexp(1.0, std::min(retry - 1, 60));
  cap = std::min(cap, policy.max_delay_s);
  return std::clamp(uniform01, 0.0, 1.0) * cap;
}

bool is_retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599 && status != 501);
}

}  // namespace stoker::io
