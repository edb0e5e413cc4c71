-- Interpreter workload for witch: string building, tables, closures and
-- numeric loops, run by the Lua interpreter built from source.
-- Usage: lua bench.lua [SCALE [REPS]].  Prints deterministic checksums.
-- REPS repeats the same work (benches/accuracy.py's steady state).
local scale = tonumber(arg and arg[1]) or 3
local reps = tonumber(arg and arg[2]) or 1

local function checksum(s)
  local h = 5381
  for i = 1, #s do h = (h * 33 + s:byte(i)) % 4294967296 end
  return h
end

-- 1. string building: a CSV-like report, then parse it back
local function strings(n)
  local parts = {}
  for i = 1, n do
    parts[#parts + 1] = string.format("%d,%s,%.3f", i, ("k" .. (i * 7919) % 1000), i / 7)
  end
  local text = table.concat(parts, "\n")
  local total, count = 0, 0
  for id, key, val in text:gmatch("(%d+),(k%d+),([%d%.]+)") do
    total = total + tonumber(val) + #key
    count = count + 1
  end
  return checksum(text), count, string.format("%.3f", total)
end

-- 2. tables: word counts, sorting, and a small object graph
local function tables(n)
  local seed = 12345
  local function rnd(m) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % m end
  local counts = {}
  for _ = 1, n do
    local w = "w" .. rnd(5000)
    counts[w] = (counts[w] or 0) + 1
  end
  local list = {}
  for w, c in pairs(counts) do list[#list + 1] = { word = w, count = c } end
  table.sort(list, function(a, b)
    if a.count ~= b.count then return a.count > b.count end
    return a.word < b.word
  end)
  local nodes = {}
  for i = 1, n // 4 do nodes[i] = { id = i, next = nil, weight = rnd(100) } end
  for i = 1, #nodes do nodes[i].next = nodes[rnd(#nodes) + 1] end
  local walk, p = 0, nodes[1]
  for _ = 1, n do walk = walk + p.weight; p = p.next end
  return #list, list[1].word, list[1].count, walk
end

-- 3. numeric: a small matrix multiply and a sieve
local function numeric(n)
  local a, b = {}, {}
  for i = 1, n do
    a[i], b[i] = {}, {}
    for j = 1, n do a[i][j] = (i + j) % 7 / 7; b[i][j] = (i * j) % 5 / 5 end
  end
  local trace = 0.0
  for i = 1, n do
    local ai, s = a[i], 0.0
    for k = 1, n do s = s + ai[k] * b[k][i] end
    trace = trace + s
    for j = 1, n do
      local t = 0.0
      for k = 1, n do t = t + ai[k] * b[k][j] end
    end
  end
  local limit = n * 2000
  local sieve, primes = {}, 0
  for i = 2, limit do
    if not sieve[i] then
      primes = primes + 1
      for j = i * i, limit, i do sieve[j] = true end
    end
  end
  return string.format("%.6f", trace), primes
end

-- 4. closures and coroutines
local function closures(n)
  local gen = coroutine.wrap(function()
    local a, b = 0, 1
    for _ = 1, n do coroutine.yield(a); a, b = b, (a + b) % 1000003 end
  end)
  local acc = 0
  local adders = {}
  for i = 1, 16 do adders[i] = function(x) return (x * i + 1) % 1000003 end end
  for i = 1, n do acc = adders[i % 16 + 1](acc + gen()) end
  return acc
end

for _ = 1, reps do
  print("strings", strings(math.floor(60000 * scale)))
  print("tables", tables(math.floor(200000 * scale)))
  print("numeric", numeric(math.floor(90 * scale ^ (1 / 3))))
  print("closures", closures(math.floor(200000 * scale)))
end
