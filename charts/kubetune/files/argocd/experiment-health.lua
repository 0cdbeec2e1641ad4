-- Argo CD health of a kubetune.dev Experiment (argocd-cm key
-- resource.customizations.health.kubetune.dev_Experiment; docs/how-to/gitops.md).
-- Argo CD runs it without Lua's string library: plain concatenation only.
local hs = {}
local status = obj.status or {}
local spec = obj.spec or {}
local phase = status.phase
local final = phase == "Succeeded" or phase == "Failed"
if spec.suspend == true and not final then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true: running trials are paused, no new trial starts"
  return hs
end
if phase == nil or phase == "Pending" then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubetune operator to start the Experiment"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  -- an edit from Git the operator has not taken yet: the phase is of an older spec
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to take generation " .. generation
  return hs
end
local rejected = nil
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "SpecRejected" and condition.status == "True" then
      rejected = condition.message
    end
  end
end
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = status.message or "Failed"
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = status.message or "Succeeded"
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = status.message or "Suspended"
else
  hs.status = "Progressing"
  hs.message = status.message or phase
  if status.queueReason ~= nil and status.queueReason ~= "" then
    hs.message = hs.message .. "; queued: " .. status.queueReason
  end
end
if rejected ~= nil then
  -- the run goes on with the spec it had: say which edit from Git is not applied
  hs.message = hs.message .. "; spec change refused: " .. rejected
end
return hs
