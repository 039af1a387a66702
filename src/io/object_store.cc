// ObjectStore over libcurl's multi interface: one driver thread owns the multi handle and every
// easy handle (so libcurl is only ever called from that thread, but for curl_multi_wakeup, which
// is safe from any thread); callers queue transfers and wait on futures.
#include "io/object_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <pugixml.hpp>
#include <random>
#include <thread>

#include "io/disk_cache.h"
#include "stoker/frontend/mutex.h"

namespace stoker::io {

namespace {

using Clock = std::chrono::steady_clock;

// SHA-256 of an empty payload: S3 wants x-amz-content-sha256 on every signed request, and
// libcurl (7.88) signs the empty body of a GET/HEAD with this hash.
constexpr const char* kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr std::size_t kMaxErrorBody = 64 << 10;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw std::runtime_error("curl_global_init failed");
    }
  });
}

// Percent-encodes everything but RFC 3986's unreserved characters (and '/' where kept), as
// SigV4's canonical URI and query want it.
std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

bool iequals_prefix(std::string_view line, std::string_view prefix) {
  if (line.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != prefix[i]) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) {
    s.remove_suffix(1);
  }
  return s;
}

bool transient_curl_error(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string s3_bucket_url(const S3Settings& settings, const std::string& bucket) {
  if (!settings.endpoint.empty()) return settings.endpoint + "/" + uri_encode(bucket, false);
  return "https://" + bucket + ".s3." + settings.region + ".amazonaws.com";
}

std::string s3_object_url(const S3Settings& settings, const std::string& bucket,
                          const std::string& key) {
  return s3_bucket_url(settings, bucket) + "/" + uri_encode(key, true);
}

enum class Kind { kHead, kGet, kList, kPut };

static const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kHead:
      return "HEAD";
    case Kind::kGet:
      return "GET";
    case Kind::kList:
      return "LIST";
    case Kind::kPut:
      return "PUT";
  }
  return "?";
}

// One request, through all its attempts. Fields below `// driver` are touched only by the
// driver thread until the promise is set; the caller reads the results after the future is ready.
struct Transfer {
  Kind kind = Kind::kGet;
  std::string url;       // as the caller gave it (for messages)
  std::string http_url;  // what is requested
  bool s3 = false;
  std::uint64_t offset = 0;  // GET: the range
  std::size_t length = 0;
  std::byte* dst = nullptr;
  std::string put_data;     // PUT: the body
  std::size_t put_pos = 0;  // PUT: bytes sent
  std::promise<void> done;
  bool ahead = false;             // Priority::kAhead, until its first retry
  std::function<void()> on_done;  // after `done` is set, on the driver

  // driver
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  int attempts = 0;
  Clock::time_point retry_at;
  std::size_t delivered = 0;           // GET: bytes in dst, from its start
  bool complete = false;               // GET: every byte delivered
  bool bad_offset = false;             // GET: the server's bytes began past where they were wanted
  long status = 0;                     // of the current response
  std::uint64_t body_pos = 0;          // GET: the object offset of the next body byte
  std::optional<std::uint64_t> total;  // from Content-Range
  std::string body;                    // LIST: the XML; errors: the error body (capped)
  std::string etag;
  std::uint64_t content_length = 0;
  bool has_content_length = false;
  std::string last_error;  // of the last failed attempt, for the final message
  long last_status = 0;
  std::string last_code;
};

struct ObjectStore::Impl {
  S3Settings settings;
  ObjectStoreOptions options;
  ProxySettings proxies = load_proxy_settings();  // read here, not by libcurl on the driver

  std::atomic<std::uint64_t> list_requests{0}, head_requests{0}, get_requests{0}, put_requests{0},
      bytes_fetched{0}, retries{0}, resumed_bodies{0}, failures{0}, connections{0};

  detail::Mutex mu;
  std::deque<std::shared_ptr<Transfer>> incoming STOKER_GUARDED_BY(mu);
  bool stopping STOKER_GUARDED_BY(mu) = false;

  std::unique_ptr<DiskCache> cache;
  CURLM* multi = nullptr;
  std::thread driver;

  // driver only
  std::deque<std::shared_ptr<Transfer>> waiting;   // ready to start, before `ahead`
  std::deque<std::shared_ptr<Transfer>> ahead;     // ready to start: fetches ahead, in order
  std::vector<std::shared_ptr<Transfer>> delayed;  // retries waiting for their time
  std::vector<std::shared_ptr<Transfer>> running;
  std::mt19937_64 rng{std::random_device{}()};

  Impl(S3Settings s, ObjectStoreOptions o) : settings(std::move(s)), options(std::move(o)) {
    options.max_in_flight = std::max(options.max_in_flight, 1);
    if (!options.cache_dir.empty()) {
      cache = std::make_unique<DiskCache>(options.cache_dir, options.cache_bytes);
    }
    global_init();
    multi = curl_multi_init();
    if (multi == nullptr) throw std::runtime_error("curl_multi_init failed");
    driver = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      detail::MutexLock lock(mu);
      stopping = true;
    }
    curl_multi_wakeup(multi);
    driver.join();
    curl_multi_cleanup(multi);
  }

  std::future<void> submit(std::shared_ptr<Transfer> t) {
    std::future<void> f = t->done.get_future();
    {
      detail::MutexLock lock(mu);
      if (stopping) throw std::runtime_error("ObjectStore: closed");
      incoming.push_back(std::move(t));
    }
    curl_multi_wakeup(multi);
    return f;
  }

  // ---- building requests ----

  std::string s3_base(const std::string& bucket) const { return s3_bucket_url(settings, bucket); }

  std::shared_ptr<Transfer> make(Kind kind, const std::string& url) {
    ObjectUrl u = parse_object_url(url);
    auto t = std::make_shared<Transfer>();
    t->kind = kind;
    t->url = url;
    t->s3 = u.scheme == ObjectUrl::Scheme::kS3;
    if (t->s3) {
      t->http_url = s3_object_url(settings, u.bucket, u.key);
    } else {
      t->http_url = url;
    }
    return t;
  }

  // ---- the driver ----

  void run() {
    for (;;) {
      {
        detail::MutexLock lock(mu);
        while (!incoming.empty()) {
          (incoming.front()->ahead ? ahead : waiting).push_back(std::move(incoming.front()));
          incoming.pop_front();
        }
        if (stopping) break;
      }
      Clock::time_point now = Clock::now();
      for (std::size_t i = 0; i < delayed.size();) {
        if (delayed[i]->retry_at <= now) {
          waiting.push_back(std::move(delayed[i]));
          delayed[i] = std::move(delayed.back());
          delayed.pop_back();
        } else {
          ++i;
        }
      }
      while (static_cast<int>(running.size()) < options.max_in_flight &&
             (!waiting.empty() || !ahead.empty())) {
        auto& from = !waiting.empty() ? waiting : ahead;
        std::shared_ptr<Transfer> t = std::move(from.front());
        from.pop_front();
        start(std::move(t));
      }
      int still = 0;
      curl_multi_perform(multi, &still);
      int left = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURLcode rc = msg->data.result;
        Transfer* raw = nullptr;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &raw);
        auto it = std::find_if(running.begin(), running.end(),
                               [raw](const auto& p) { return p.get() == raw; });
        std::shared_ptr<Transfer> t = std::move(*it);
        running.erase(it);
        finish(std::move(t), rc);
      }
      int timeout_ms = 1000;
      if ((!waiting.empty() || !ahead.empty()) &&
          static_cast<int>(running.size()) < options.max_in_flight) {
        timeout_ms = 0;
      }
      for (const auto& d : delayed) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d->retry_at - Clock::now())
                      .count();
        timeout_ms = std::clamp(static_cast<int>(ms) + 1, 0, timeout_ms);
      }
      curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
    }
    // Closing: fail whatever is left.
    auto fail_closed = [](const std::shared_ptr<Transfer>& t) {
      settle(*t,
             std::make_exception_ptr(ObjectStoreError(
                 ObjectStoreError::Kind::kClient, t->url, 0, "",
                 std::string(kind_name(t->kind)) + " " + t->url + ": the ObjectStore was closed")));
    };
    for (auto& t : running) {
      release(*t);
      fail_closed(t);
    }
    for (auto* queue : {&waiting, &ahead}) {
      for (auto& t : *queue) fail_closed(t);
      queue->clear();
    }
    for (auto& t : delayed) fail_closed(t);
    running.clear();
    delayed.clear();
  }

  void release(Transfer& t) {
    if (t.easy != nullptr) {
      curl_multi_remove_handle(multi, t.easy);
      curl_easy_cleanup(t.easy);
      t.easy = nullptr;
    }
    if (t.headers != nullptr) {
      curl_slist_free_all(t.headers);
      t.headers = nullptr;
    }
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {  // a new response (after a 100 Continue, say)
      std::size_t sp = line.find(' ');
      t->status =
          sp == std::string_view::npos ? 0 : std::atol(std::string(line.substr(sp + 1, 3)).c_str());
      t->total.reset();
      t->body_pos = 0;
      t->has_content_length = false;
      t->body.clear();
    } else if (iequals_prefix(line, "content-range:")) {
      // "bytes FIRST-LAST/TOTAL"
      std::string v(trim(line.substr(14)));
      unsigned long long first = 0, last = 0, total = 0;
      if (std::sscanf(v.c_str(), "bytes %llu-%llu/%llu", &first, &last, &total) == 3) {
        t->body_pos = first;
        t->total = total;
      } else if (std::sscanf(v.c_str(), "bytes */%llu", &total) == 1) {
        t->total = total;
      }
    } else if (iequals_prefix(line, "content-length:")) {
      t->content_length = std::strtoull(std::string(trim(line.substr(15))).c_str(), nullptr, 10);
      t->has_content_length = true;
    } else if (iequals_prefix(line, "etag:")) {
      t->etag = std::string(trim(line.substr(5)));
    }
    return size * n;
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::size_t len = size * n;
    if (t->kind != Kind::kGet || t->status < 200 || t->status >= 300) {
      if (t->body.size() < kMaxErrorBody || t->kind == Kind::kList) t->body.append(data, len);
      return len;
    }
    if (t->complete) return 0;  // more than was asked for (a 200 to a range): stop here
    std::uint64_t want_begin = t->offset + t->delivered;
    std::uint64_t want_end = t->offset + t->length;
    std::uint64_t chunk_begin = t->body_pos;
    std::uint64_t chunk_end = chunk_begin + len;
    t->body_pos = chunk_end;
    std::uint64_t lo = std::max(want_begin, chunk_begin);
    std::uint64_t hi = std::min(want_end, chunk_end);
    if (lo < hi) {
      if (lo != want_begin) {
        t->bad_offset = true;
        return 0;
      }
      std::memcpy(t->dst + (lo - t->offset), data + (lo - chunk_begin), hi - lo);
      t->delivered += hi - lo;
      t->complete = t->delivered == t->length;
    }
    return t->complete && chunk_end > want_end ? 0 : len;
  }

  static std::size_t on_read(char* buffer, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::size_t len = std::min(size * n, t->put_data.size() - t->put_pos);
    std::memcpy(buffer, t->put_data.data() + t->put_pos, len);
    t->put_pos += len;
    return len;
  }

  void start(std::shared_ptr<Transfer> t) {
    if (t->kind == Kind::kGet && t->length == 0) {  // nothing to fetch
      succeed(*t);
      return;
    }
    CURL* e = curl_easy_init();
    if (e == nullptr) {
      settle(*t, std::make_exception_ptr(std::runtime_error("curl_easy_init failed")));
      return;
    }
    t->easy = e;
    t->error[0] = 0;
    t->status = 0;
    t->body.clear();
    t->total.reset();
    t->has_content_length = false;
    t->content_length = 0;
    t->put_pos = 0;
    ++t->attempts;
    curl_easy_setopt(e, CURLOPT_URL, t->http_url.c_str());
    curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->error);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &Impl::on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Impl::on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options.connect_timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                     std::max(1L, static_cast<long>(options.stall_timeout_s)));
    // Given, so that libcurl reads no environment on this thread (ProxySettings).
    curl_easy_setopt(e, CURLOPT_PROXY,
                     (t->http_url.starts_with("https:") ? proxies.https : proxies.http).c_str());
    curl_easy_setopt(e, CURLOPT_NOPROXY, proxies.no_proxy.c_str());
    if (!t->s3) {
      curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
      curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
    }
    bool empty_payload = true;
    switch (t->kind) {
      case Kind::kHead:
        head_requests.fetch_add(1, std::memory_order_relaxed);
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        break;
      case Kind::kList:
        list_requests.fetch_add(1, std::memory_order_relaxed);
        break;
      case Kind::kGet: {
        get_requests.fetch_add(1, std::memory_order_relaxed);
        std::string range = "Range: bytes=" + std::to_string(t->offset + t->delivered) + "-" +
                            std::to_string(t->offset + t->length - 1);
        t->headers = curl_slist_append(t->headers, range.c_str());
        break;
      }
      case Kind::kPut:
        put_requests.fetch_add(1, std::memory_order_relaxed);
        if (t->put_data.empty()) {  // a bucket, or an empty object: no body to send
          curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PUT");
          break;
        }
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, &Impl::on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, t.get());
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t->put_data.size()));
        // libcurl 7.88 signs an upload's payload as empty; SeaweedFS accepts that only with
        // no x-amz-content-sha256 header and with libcurl's "Expect: 100-continue" (kept).
        empty_payload = false;
        break;
    }
    if (t->s3 && !settings.anonymous()) {
      std::string sigv4 = "aws:amz:" + settings.region + ":s3";
      curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(e, CURLOPT_USERNAME, settings.access_key_id.c_str());
      curl_easy_setopt(e, CURLOPT_PASSWORD, settings.secret_access_key.c_str());
      if (empty_payload) {
        t->headers = curl_slist_append(
            t->headers, (std::string("x-amz-content-sha256: ") + kEmptySha256).c_str());
      }
      if (!settings.session_token.empty()) {
        t->headers = curl_slist_append(t->headers,
                                       ("x-amz-security-token: " + settings.session_token).c_str());
      }
    }
    if (t->headers != nullptr) curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
    curl_multi_add_handle(multi, e);
    running.push_back(std::move(t));
  }

  // ---- outcomes ----

  // Makes the transfer's future ready (with `error`, if any), then calls its on_done.
  static void settle(Transfer& t, std::exception_ptr error) {
    if (error) {
      t.done.set_exception(std::move(error));
    } else {
      t.done.set_value();
    }
    if (t.on_done) t.on_done();
  }

  void succeed(Transfer& t) {
    if (t.kind == Kind::kGet) bytes_fetched.fetch_add(t.delivered, std::memory_order_relaxed);
    settle(t, nullptr);
  }

  void fail(Transfer& t, ObjectStoreError::Kind kind, long status, const std::string& code,
            const std::string& message) {
    failures.fetch_add(1, std::memory_order_relaxed);
    if (t.kind == Kind::kGet) bytes_fetched.fetch_add(t.delivered, std::memory_order_relaxed);
    settle(t, std::make_exception_ptr(ObjectStoreError(kind, t.url, status, code, message)));
  }

  void retry_or_fail(std::shared_ptr<Transfer> t, long status, const std::string& code,
                     const std::string& what) {
    t->last_status = status;
    t->last_code = code;
    t->last_error = what;
    if (t->attempts >= options.retry.max_attempts) {
      std::string message = std::string(kind_name(t->kind)) + " " + t->url + " failed after " +
                            std::to_string(t->attempts) + " attempts; the last: " + what;
      fail(*t, ObjectStoreError::Kind::kExhausted, status, code, message);
      return;
    }
    retries.fetch_add(1, std::memory_order_relaxed);
    if (t->kind == Kind::kGet && t->delivered > 0) {
      resumed_bodies.fetch_add(1, std::memory_order_relaxed);
    }
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    double delay = retry_delay(options.retry, t->attempts, u);
    t->retry_at = Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay));
    t->ahead = false;  // late already: its retries go before the fetches ahead
    delayed.push_back(std::move(t));
  }

  // "HTTP 503 SlowDown: Please reduce your request rate." from the status and an S3 error body.
  static std::string describe(long status, const std::string& body, std::string* code_out) {
    std::string code, message;
    if (!body.empty()) {
      pugi::xml_document doc;
      if (doc.load_buffer(body.data(), body.size())) {
        pugi::xml_node error = doc.child("Error");
        code = error.child_value("Code");
        message = error.child_value("Message");
      }
    }
    *code_out = code;
    std::string out = "HTTP " + std::to_string(status);
    if (!code.empty()) out += " " + code;
    if (!message.empty()) out += ": " + message;
    return out;
  }

  void finish(std::shared_ptr<Transfer> t, CURLcode rc) {
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    long connects = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0) {
      connections.fetch_add(static_cast<std::uint64_t>(connects), std::memory_order_relaxed);
    }
    std::string curl_message = t->error[0] ? t->error : curl_easy_strerror(rc);
    release(*t);
    std::string name = std::string(kind_name(t->kind)) + " " + t->url;
    if (t->kind == Kind::kGet && t->complete) {
      succeed(*t);
      return;
    }
    if (rc != CURLE_OK) {
      if (t->bad_offset) {
        fail(*t, ObjectStoreError::Kind::kClient, status, "",
             name + ": the server sent bytes from another offset than the range asked for");
      } else if (transient_curl_error(rc)) {
        retry_or_fail(std::move(t), status, "",
                      curl_message + " (curl error " + std::to_string(rc) + ")");
      } else {
        fail(*t, ObjectStoreError::Kind::kClient, status, "",
             name + ": " + curl_message + " (curl error " + std::to_string(rc) + ")");
      }
      return;
    }
    if (status >= 200 && status < 300) {
      if (t->kind != Kind::kGet) {
        if (t->kind == Kind::kHead && !t->has_content_length) {
          fail(*t, ObjectStoreError::Kind::kClient, status, "",
               name + ": the response has no Content-Length (size unknown)");
          return;
        }
        succeed(*t);
        return;
      }
      // A body shorter than the range: past the object's end, or cut short (resumed).
      if (t->total && t->offset + t->length > *t->total) {
        fail(*t, ObjectStoreError::Kind::kRange, status, "",
             name + ": bytes " + std::to_string(t->offset) + "-" +
                 std::to_string(t->offset + t->length) + " lie past the object's end (" +
                 std::to_string(*t->total) + " bytes)");
        return;
      }
      retry_or_fail(std::move(t), status, "",
                    "the body ended early (HTTP " + std::to_string(status) + ")");
      return;
    }
    std::string code;
    std::string what = describe(status, t->body, &code);
    if (is_retryable_status(status)) {
      retry_or_fail(std::move(t), status, code, what);
    } else if (status == 404) {
      std::string hint = code == "NoSuchBucket" ? " (no such bucket)"
                         : code == "NoSuchKey"  ? " (no such object)"
                         : code.empty()         ? " (no such bucket or object)"
                                                : "";
      fail(*t, ObjectStoreError::Kind::kNotFound, status, code, name + ": " + what + hint);
    } else if (status == 401 || status == 403) {
      fail(*t, ObjectStoreError::Kind::kAccessDenied, status, code,
           name + ": " + what +
               " (access denied: check the credentials, AWS_ACCESS_KEY_ID / AWS_PROFILE, and "
               "the bucket's permissions)");
    } else if (status == 416) {
      fail(*t, ObjectStoreError::Kind::kRange, status, code,
           name + ": " + what + " (the range lies past the object's end)");
    } else {
      fail(*t, ObjectStoreError::Kind::kClient, status, code, name + ": " + what);
    }
  }
};

// ---- ObjectStore ----

ObjectStore::ObjectStore(ObjectStoreOptions options)
    : ObjectStore(load_s3_settings(options.s3), options) {}

ObjectStore::ObjectStore(S3Settings settings, ObjectStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(settings), std::move(options))) {}

ObjectStore::~ObjectStore() = default;

const S3Settings& ObjectStore::settings() const { return impl_->settings; }

std::uint64_t ObjectStore::size(const std::string& url) {
  auto t = impl_->make(Kind::kHead, url);
  impl_->submit(t).get();
  return t->content_length;
}

ObjectInfo ObjectStore::head(const std::string& url) {
  auto t = impl_->make(Kind::kHead, url);
  impl_->submit(t).get();
  ObjectInfo info;
  info.url = url;
  info.key = parse_object_url(url).key;
  info.size = t->content_length;
  info.etag = t->etag;
  return info;
}

std::vector<ObjectInfo> ObjectStore::list(const std::string& prefix_url) {
  ObjectUrl u = parse_object_url(prefix_url);
  if (u.scheme != ObjectUrl::Scheme::kS3) {
    throw ObjectStoreError(ObjectStoreError::Kind::kClient, prefix_url, 0, "",
                           "LIST " + prefix_url +
                               ": an http(s) URL has no listing; give the objects' URLs, or an "
                               "s3:// prefix");
  }
  std::vector<ObjectInfo> out;
  std::string token;
  for (;;) {
    // Query parameters in SigV4's canonical order (sorted by name), encoded once.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + uri_encode(token, false) + "&";
    query += "list-type=2";
    if (!u.key.empty()) query += "&prefix=" + uri_encode(u.key, false);
    auto t = impl_->make(Kind::kList, prefix_url);
    t->http_url = impl_->s3_base(u.bucket) + "/?" + query;
    impl_->submit(t).get();
    pugi::xml_document doc;
    pugi::xml_parse_result parsed = doc.load_buffer(t->body.data(), t->body.size());
    pugi::xml_node result = doc.child("ListBucketResult");
    if (!parsed || !result) {
      throw ObjectStoreError(ObjectStoreError::Kind::kClient, prefix_url, 200, "",
                             "LIST " + prefix_url + ": the answer is not a ListBucketResult");
    }
    for (pugi::xml_node c : result.children("Contents")) {
      ObjectInfo info;
      info.key = c.child_value("Key");
      info.url = "s3://" + u.bucket + "/" + info.key;
      info.size = std::strtoull(c.child_value("Size"), nullptr, 10);
      info.etag = c.child_value("ETag");
      out.push_back(std::move(info));
    }
    if (std::string_view(result.child_value("IsTruncated")) != "true") break;
    token = result.child_value("NextContinuationToken");
    if (token.empty()) {
      throw ObjectStoreError(ObjectStoreError::Kind::kClient, prefix_url, 200, "",
                             "LIST " + prefix_url + ": truncated, with no continuation token");
    }
  }
  return out;
}

std::future<void> ObjectStore::submit_read(const std::string& url, std::uint64_t offset,
                                           std::size_t length, std::byte* dst, Priority priority,
                                           std::function<void()> on_done) {
  auto t = impl_->make(Kind::kGet, url);
  t->offset = offset;
  t->length = length;
  t->dst = dst;
  t->ahead = priority == Priority::kAhead;
  t->on_done = std::move(on_done);
  return impl_->submit(std::move(t));
}

void ObjectStore::read(const std::string& url, std::uint64_t offset, std::size_t length,
                       std::byte* dst) {
  DiskCache* c = impl_->cache.get();
  std::string key = c != nullptr ? DiskCache::key(url, offset, length) : std::string();
  if (c != nullptr && length > 0 && c->get(key, dst, length)) return;
  submit_read(url, offset, length, dst).get();
  if (c != nullptr && length > 0) c->put(key, dst, length);
}

DiskCache* ObjectStore::cache() { return impl_->cache.get(); }

std::unique_ptr<ObjectReader> ObjectStore::open(const std::string& url) {
  std::uint64_t n = size(url);
  return std::make_unique<ObjectReader>(*this, url, n, impl_->options.stream_chunk,
                                        impl_->options.stream_depth);
}

void ObjectStore::put(const std::string& url, std::string_view data) {
  auto t = impl_->make(Kind::kPut, url);
  t->put_data = std::string(data);
  impl_->submit(t).get();
}

void ObjectStore::create_bucket(const std::string& bucket) {
  auto t = impl_->make(Kind::kPut, "s3://" + bucket);
  t->http_url = impl_->s3_base(bucket);
  try {
    impl_->submit(t).get();
  } catch (const ObjectStoreError& e) {
    if (e.s3_code() != "BucketAlreadyOwnedByYou") throw;
  }
}

IoStats ObjectStore::stats() const {
  IoStats s;
  auto load = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.list_requests = load(impl_->list_requests);
  s.head_requests = load(impl_->head_requests);
  s.get_requests = load(impl_->get_requests);
  s.put_requests = load(impl_->put_requests);
  s.bytes_fetched = load(impl_->bytes_fetched);
  s.retries = load(impl_->retries);
  s.resumed_bodies = load(impl_->resumed_bodies);
  s.failures = load(impl_->failures);
  s.connections = load(impl_->connections);
  if (impl_->cache) {
    DiskCache::Counters c = impl_->cache->counters();
    s.cache_hits = c.hits;
    s.cache_hit_bytes = c.hit_bytes;
  }
  return s;
}

// ---- ObjectReader ----

ObjectReader::ObjectReader(ObjectStore& store, std::string url, std::uint64_t size,
                           std::size_t chunk, int depth)
    : store_(store),
      url_(std::move(url)),
      size_(size),
      chunk_(std::max<std::size_t>(chunk, 1)),
      depth_(std::max(depth, 1)) {
  fill();
}

ObjectReader::~ObjectReader() {
  // The transfers write into the chunks: wait for them before the chunks go.
  for (auto& c : ahead_) {
    if (c->done.valid()) c->done.wait();
  }
}

void ObjectReader::fill() {
  while (static_cast<int>(ahead_.size()) < depth_ && next_fetch_ < size_) {
    auto c = std::make_unique<Chunk>();
    c->offset = next_fetch_;
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, size_ - next_fetch_));
    c->data.resize(n);
    DiskCache* cache = store_.cache();
    if (cache == nullptr || !cache->get(DiskCache::key(url_, next_fetch_, n), c->data.data(), n)) {
      c->done = store_.submit_read(url_, next_fetch_, n, c->data.data());
      c->fetched = true;
    }
    next_fetch_ += n;
    ahead_.push_back(std::move(c));
  }
}

std::size_t ObjectReader::read(std::byte* dst, std::size_t n) {
  std::size_t copied = 0;
  while (copied < n) {
    if (!ahead_.empty() && pos_in_front_ == ahead_.front()->data.size()) {
      ahead_.erase(ahead_.begin());
      pos_in_front_ = 0;
      fill();
    }
    if (ahead_.empty()) break;
    if (error_) std::rethrow_exception(error_);
    Chunk& front = *ahead_.front();
    if (front.done.valid()) {
      try {
        front.done.get();
      } catch (...) {
        error_ = std::current_exception();
        throw;
      }
      if (DiskCache* cache = store_.cache(); cache != nullptr && front.fetched) {
        cache->put(DiskCache::key(url_, front.offset, front.data.size()), front.data.data(),
                   front.data.size());
      }
    }
    std::size_t k = std::min(n - copied, front.data.size() - pos_in_front_);
    std::memcpy(dst + copied, front.data.data() + pos_in_front_, k);
    pos_in_front_ += k;
    copied += k;
  }
  return copied;
}

}  // namespace stoker::io
