-- Argo CD health of a kubetune.dev Trial (argocd-cm key
-- resource.customizations.health.kubetune.dev_Trial; docs/how-to/gitops.md).
-- Argo CD runs it without Lua's string library: plain concatenation only.
local hs = {}
local status = obj.status
local phase = status ~= nil and status.phase or nil
local function said(default)
  if status ~= nil and status.reason ~= nil and status.reason ~= "" then
    return phase .. " (" .. status.reason .. ")"
  end
  return default
end
if phase == nil or phase == "Pending" or phase == "Queued" or phase == "Running" then
  hs.status = "Progressing"
  if phase == nil then
    hs.message = "Waiting for the kubetune operator"
  elseif phase == "Queued" and status.message ~= nil and status.message ~= "" then
    hs.message = "Queued: " .. status.message
  else
    hs.message = said(phase)
  end
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = said("Paused")
elseif phase == "Succeeded" or phase == "Stopped" then
  -- Stopped: ended early by the scheduler (early stopping), an expected outcome
  hs.status = "Healthy"
  hs.message = said(phase)
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = said("Failed")
  local failures = status.failures
  if failures ~= nil and #failures > 0 and failures[#failures].message ~= nil then
    -- the last error's first line (status.message may hold a whole traceback)
    hs.message = hs.message .. ": " .. failures[#failures].message
  elseif status.message ~= nil and status.message ~= "" then
    hs.message = hs.message .. ": " .. status.message
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. phase
end
return hs
